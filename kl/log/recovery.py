"""Checking and repairing a partition (``kl recover``): fsck for one log.

What is changed without being asked: bytes past the published log end of the segment
kl appends to (never acknowledged), a torn tail past the stable offset (data a crash may
have torn; see ``Segment.good_end``), a killed roll's unpublished segment, zero bytes a
closed segment holds past the next segment's base, bytes a writer that had lost its lock
wrote late past a closed segment's end (on NFS; never served), and a missing or damaged
state record (rebuilt from the segments).

What is only reported: damage below the stable offset, which held acknowledged data
that no crash can tear; segment files the state does not account for; files that are
not kl's to change (Kafka 0.7 segments of a kl topic).  ``repair=True`` fixes damage
too, after copying each damaged segment aside once: every damaged region is overwritten
with padding messages that readers skip, so every later offset stays valid and no valid
message that provably follows is lost; a segment cut short is padded up to where the
next one begins.  Nothing valid is ever cut.  A topic of format 0.7 is checked and
repaired the same way, in its own ``.kafka`` segments; its padding messages are magic 1
ones, which Kafka 0.7 clients can parse (they receive them as values of zero bytes).

Padding takes no Kafka offset, so the damaged messages' Kafka offsets cannot stay
theirs.  A repair keeps every later message's and the log end's (those consumers hold
positions at, and which new messages are numbered from): the messages before the damage
move up by the number lost.  Counts run back from the active segment, so that holds by
itself for a closed segment; for the active one the repair publishes its base count
moved up (``_keep_numbers``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kl.errors import CorruptMessage, CorruptState
from kl.log import offsetindex, producers, timeindex
from kl.log.fsutil import file_time_ns, fsync_dir, open_file, storage_error
from kl.log.log import DELETED_SUFFIX, IMPORTING_PREFIX, Log, SegmentInfo
from kl.log.messageset import Corruption, Kind
from kl.log.segment import Damage, Segment, list_segments, padding_min, parse_name, segment_name, segment_path
from kl.log.state import BOOT_ID, UNKNOWN, PartitionState
from kl.log.state import SIZE as STATE_SIZE

Progress = Callable[[int], None]
"""Called with the number of bytes just checked."""
Reporter = Callable[["Finding"], None]
"""Called with each finding as it is made (leveldb's ``Reporter``), before the report is done."""
TIME_SUMMARY = "TIME_SUMMARY"
"""The kind of a finding about a segment's time summary."""
OFFSET_INDEX = "OFFSET_INDEX"
"""The kind of a finding about a segment's offset index."""
LEFTOVER = "LEFTOVER"
"""The kind of a finding about a file a killed run left (a temporary file, a partial copy)."""
LEFTOVER_MIN_AGE = 600.0
"""Seconds a leftover a live run might still be writing must have stood unchanged, by the
file system's clock, before it is removed (here, and ``Root.remove_leftovers``)."""
TEMPORARY_SUFFIX = ".tmp"
"""Temporary files end with it and start with a dot (``fsutil.write_atomic``'s among them)."""
TEMPORARY = "temporary file left by an interrupted write"
COPY_MARK = ".damaged-"
"""In the name of a segment's copy set aside before a repair: ``NAME.damaged-TIME-XXXXXX``."""
_WOULD = {"cut": "would cut", "removed": "would remove", "rebuilt": "would rebuild", "set aside": "would set aside"}


@dataclass
class Finding:
    """One problem: where, what, and what was done about it."""

    offset: int
    path: str
    reason: str
    action: str
    """"cut", "repaired", "removed", "rebuilt", "set aside"; with ``dry_run`` "would cut",
    "would remove", ...; or "reported": left as it is (``repair`` fixes damage)."""
    kind: str = Kind.CHECKSUM.name
    """The ``Kind`` of the problem, by name (``STATE`` for the state record)."""


@dataclass
class RecoveryReport:
    directory: str
    checked_bytes: int = 0
    cut_bytes: int = 0
    cut_messages: int = 0
    findings: list[Finding] = field(default_factory=list)
    copies: dict[str, str] = field(default_factory=dict)
    """Segment path -> the copy set aside before it was repaired (one per segment per run)."""

    @property
    def unrepaired(self) -> list[Finding]:
        return [f for f in self.findings if f.action == "reported"]


def recover(
    log: Log,
    *,
    deep: bool = False,
    repair: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
    reporter: Reporter | None = None,
) -> RecoveryReport:
    """Check ``log`` and cut or repair what is safe (nothing at all with ``dry_run``).

    ``deep`` checks every message of every segment, not just sizes and the tail.  Safe
    while producers and consumers run: everything happens under the partition lock
    (a dry run takes no lock, so it needs no write access to the root).  ``progress``
    hears of the bytes checked, ``reporter`` of each finding as it is made.  Without
    ``deep``, a partition is first looked at as a dry run does, and the lock is taken
    only when that finds anything: what a crash leaves stays until it is cut, and what
    a writer at work leaves for a moment is looked at again under the lock.
    """
    if not dry_run and not deep:
        look = RecoveryReport(log.directory)
        if _Check(log, look, act=False, repair=False, deep=False, progress=None, reporter=None).run() and not look.findings:
            if progress is not None:
                progress(look.checked_bytes)
            return look
    report = RecoveryReport(log.directory)
    check_ = _Check(log, report, act=not dry_run, repair=repair and not dry_run, deep=deep, progress=progress, reporter=reporter)
    with contextlib.nullcontext() if dry_run else log.locked():
        check_.run()
    return report


class _Check:
    def __init__(
        self,
        log: Log,
        report: RecoveryReport,
        *,
        act: bool,
        repair: bool,
        deep: bool,
        progress: Progress | None,
        reporter: Reporter | None,
    ):
        self.log, self.report, self.act, self.repair, self.deep = log, report, act, repair, deep
        self.progress = progress or (lambda n: None)
        self.reporter = reporter
        self.limit = log.config.max_message_bytes
        self.names: list[str] = []
        """The partition directory's entries, as ``_segments`` listed them."""
        self.padded_active = False
        """Damage in the active segment was padded over (its messages must be numbered again)."""

    def run(self) -> bool:
        """Check the partition; False when it has no active segment."""
        state = self._state()
        segments = self._segments(state)
        for segment, following in itertools.pairwise(segments):
            self._check_closed(segment, following.base_offset)
        self._check_time_summaries(segments[:-1])
        self._check_offset_indexes(segments)
        if segments:
            self._check_active(state, segments[-1])
        elif self.act:
            name = segment_name(state.active_base_offset, self.log.suffix)
            raise CorruptState(f"partition {self.log.directory} has no active segment {name}")
        return bool(segments)

    def find(self, offset: int, path: str, problem: str, action: str, kind: Kind | str) -> None:
        name = kind.name if isinstance(kind, Kind) else kind
        finding = Finding(offset, path, problem, action, name)
        self.report.findings.append(finding)
        if self.reporter is not None:
            self.reporter(finding)

    def would(self, done: str) -> str:
        """The action as done, or as it would be done in a dry run."""
        return done if self.act else _WOULD[done]

    # ----------------------------------------------------------------- the state record

    def _state(self) -> PartitionState:
        """The state record, rebuilt from the segments when it is missing or damaged."""
        log = self.log
        try:
            fd = os.open(log.state_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            reason = "state record is missing"
        except OSError as e:
            raise storage_error(e, "read", log.state_path) from None
        else:
            try:
                log.revalidate(fd, log.state_path)
                return PartitionState.decode(os.pread(fd, STATE_SIZE, 0), log.state_path)
            except CorruptState as e:
                reason = str(e).removesuffix("; run 'kl recover'")
            finally:
                os.close(fd)
        found = [(base, name) for base, name in list_segments(log.directory)]
        if not found:
            found = [(0, segment_name(0, log.suffix))]
            if self.act:
                os.close(open_file(os.path.join(log.directory, found[0][1]), os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW))
        first, last = found[0][0], found[-1][0]
        end = last
        path = segment_path(log.directory, last)
        if os.path.exists(path):
            with Segment.open(path, last, self.limit) as segment:
                log.revalidate(segment.fd, segment.path)
                end = last + _last_message_end(segment)
        now = time.time_ns() // 1_000_000
        state = PartitionState(first, last, end, end, end, 0, now, BOOT_ID, producer_serial=producers.last_serial(log.directory))
        self.find(end, log.state_path, f"{reason}; rebuilt to end after the last valid message", self.would("rebuilt"), "STATE")
        if self.act:
            log.write_state(state)
        return state

    # ----------------------------------------------------------------- which files

    def _segments(self, state: PartitionState) -> list[SegmentInfo]:
        """The segments the state accounts for; the others, and leftovers of killed
        runs, are dealt with or reported.  One listing of the directory serves them all."""
        log = self.log
        unknown = Kind.UNKNOWN_SEGMENT
        with os.scandir(log.directory) as entries:
            listed = {e.name: e.is_symlink() for e in entries}
        self.names = list(listed)
        for name in listed:
            if name.startswith(IMPORTING_PREFIX):
                path = os.path.join(log.directory, name)
                self.find(state.log_start_offset, path, "left by an interrupted kl topics import", self.would("removed"), unknown)
                if self.act:
                    os.unlink(path)
        self._temporary([name for name in listed if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)], state)
        links = set()
        for base, name in sorted((base, name) for name in listed if (base := parse_name(name)) is not None):
            path = os.path.join(log.directory, name)
            if listed[name]:
                links.add(path)
                self.find(base, path, "segment file is a symbolic link", "reported", unknown)
            elif base < state.log_start_offset:
                self.find(base, path, "segment below the log start was not set aside", self.would("set aside"), unknown)
                if self.act:
                    os.rename(path, path + DELETED_SUFFIX)
            elif base > state.active_base_offset and name.endswith(log.suffix):
                self.report.cut_bytes += os.path.getsize(path)
                reason = "segment past the active one was never published (a roll was killed)"
                self.find(base, path, reason, self.would("removed"), unknown)
                if self.act:
                    os.unlink(path)
            elif base > state.active_base_offset:
                reason = "segment of the other format past the active one; left alone (bring it in with 'kl topics import')"
                self.find(base, path, reason, "reported", unknown)
            elif name != segment_name(base) and segment_name(base) in listed:  # kl's name wins (segment_path)
                self.find(base, path, f"a second segment file with base offset {base}; left alone", "reported", unknown)
        return [s for s in log.segments(state) if s.path not in links]

    def _temporary(self, names: list[str], state: PartitionState) -> None:
        """Remove temporary files killed runs left: a repair's partial copy at once (one is
        made only under the partition lock, held here), the others (an atomic write's, a
        clock reading's; see ``kl.log.fsutil``) once unchanged for ``LEFTOVER_MIN_AGE``
        seconds by the file system's clock, so that a write under way, a reader keeping a
        time summary, is left alone."""
        now = None
        for name in names:
            path = os.path.join(self.log.directory, name)
            if COPY_MARK in name:
                reason = "partial copy of a segment left by an interrupted kl recover --repair"
            else:
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                now = file_time_ns(self.log.directory) if now is None else now
                if now - max(st.st_mtime_ns, st.st_ctime_ns) < LEFTOVER_MIN_AGE * 1e9:
                    continue
                reason = TEMPORARY
            self.find(state.log_start_offset, path, reason, self.would("removed"), LEFTOVER)
            if self.act:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    # ----------------------------------------------------------------- closed segments

    def _check_closed(self, info: SegmentInfo, next_base: int) -> None:
        """A closed segment must hold valid messages ending exactly at the next base."""
        expected = next_base - info.base_offset
        with Segment.open(info.path, info.base_offset, self.limit, writable=self.act) as segment:
            self.log.revalidate(segment.fd, segment.path)
            size = segment.size_in_bytes()
            if self.deep:
                damages = list(segment.damage(0, expected))
                self.report.checked_bytes += size
                self.progress(size)
            else:
                damages = list(_size_damage(segment, size, expected))
                if self.repair and any(d.problem.kind is Kind.SHORT_FILE for d in damages):
                    damages = list(segment.damage(0, expected))  # padding begins where the last whole message ends
            for damage in damages:
                self._damaged(segment, damage, active=False)

    def _remove_orphans(self, kept: list[SegmentInfo], suffix: str, what: str, kind: str) -> None:
        """Report (and remove) the files kept beside segments, with ``suffix``, of none of
        ``kept``: ``what`` says what they are."""
        for path in timeindex.orphans(self.log.directory, {s.base_offset for s in kept}, self.names, suffix):
            base = parse_name(os.path.basename(path).removesuffix(suffix)) or 0
            self.find(base, path, what, self.would("removed"), kind)
            if self.act:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _check_time_summaries(self, closed: list[SegmentInfo]) -> None:
        """A closed segment's time summary (``kl.log.timeindex``) must name the segment as
        it is: a damaged or stale one is rebuilt (a missing one is made when first
        needed), and one of no closed segment is removed."""
        log = self.log
        self._remove_orphans(closed, timeindex.SUFFIX, "time summary of no closed segment", TIME_SUMMARY)
        for info in closed:
            path = timeindex.summary_path(info.path)
            stat = os.stat(info.path, follow_symlinks=False)
            if not os.path.lexists(path) or timeindex.read(info.path, info.base_offset, stat.st_size, stat.st_mtime_ns):
                continue
            self.find(info.base_offset, path, "time summary is damaged or stale", self.would("rebuilt"), TIME_SUMMARY)
            if self.act:
                timeindex.remove(info.path)
                with contextlib.suppress(CorruptMessage):  # made when first needed once the segment is mended
                    log.time_summary(info)

    def _check_offset_indexes(self, segments: list[SegmentInfo]) -> None:
        """A closed segment's offset index (``kl.log.offsetindex``) must name the segment
        as it is and hold its messages' count: a damaged, stale or wrong one is rebuilt
        (keeping the base count it says, which recovery of a lost state record starts
        from), and one of no segment is removed (the active one's keeps its base count)."""
        log = self.log
        self._remove_orphans(segments, offsetindex.SUFFIX, "offset index of no segment", OFFSET_INDEX)
        for info in segments[:-1]:
            path = offsetindex.index_path(info.path)
            try:
                with open(path, "rb") as f:
                    kept = offsetindex.SegmentIndex.decode(f.read())
            except FileNotFoundError:
                continue
            stat = os.stat(info.path, follow_symlinks=False)
            if kept is not None and (kept.size_in_bytes, kept.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
                continue  # stale (its segment changed): rebuilt when first needed, as a cache is
            problem = "is damaged" if kept is None else None
            if kept is not None:
                with contextlib.suppress(CorruptMessage), log.open_segment(info.base_offset) as segment:
                    counted = offsetindex.Counted(info.base_offset, kept.base_count)
                    counted.extend(segment, info.size_in_bytes)
                    if counted.count != kept.messages:
                        problem = f"counts {kept.messages} messages, the segment holds {counted.count}"
            if problem is None:
                continue
            self.find(info.base_offset, path, f"offset index {problem}", self.would("rebuilt"), OFFSET_INDEX)
            if self.act:
                offsetindex.remove(info.path)  # remade when first needed, its base count from the chain

    # ----------------------------------------------------------------- the active segment

    def _check_active(self, state: PartitionState, info: SegmentInfo) -> None:
        base = state.active_base_offset
        published = state.log_end_offset - base
        stable = state.stable_offset - base
        with Segment.open(info.path, base, self.limit, writable=self.act) as segment:
            self.log.revalidate(segment.fd, segment.path)
            file_size = segment.size_in_bytes()
            checked = min(stable, file_size)
            if self.deep:
                self.report.checked_bytes += checked
                self.progress(checked)
                for damage in list(segment.damage(0, stable)):
                    if damage.problem.kind is Kind.LONG_FILE:
                        break  # the tail past the stable offset is checked below
                    self._damaged(segment, damage, active=True)
                self._keep_numbers(segment)
            self.report.checked_bytes += max(file_size - checked, 0)
            self.progress(max(file_size - checked, 0))
            file_size = segment.size_in_bytes()
            end, why = segment.good_end(stable, state.last_append_offset - base, published)
            if end < stable:
                if not self.deep:
                    short = Damage(end, published, Corruption(Kind.SHORT_FILE, why or "file ends early"), False)
                    # a repair pads from where the last whole message ends, which a scan finds
                    for damage in list(segment.damage(0, published)) if self.repair else [short]:
                        self._damaged(segment, damage, active=True)
                    self._keep_numbers(segment)
                return
            if end == file_size == published:
                return
            if self.log.foreign(segment) and file_size > published:
                self.find(
                    base + published,
                    info.path,
                    f"{file_size - published} bytes past the log end in a segment of the other format "
                    "kl did not write; left alone (bring it in with 'kl topics import')",
                    "reported",
                    Kind.UNKNOWN_SEGMENT,
                )
                return
            self.report.cut_bytes += file_size - end
            self.report.cut_messages += _message_starts(segment, end, file_size)
            reason = why or f"{file_size - published} bytes past the log end were never published"
            self.find(base + end, info.path, reason, self.would("cut"), Kind.INCOMPLETE)
        if self.act:
            self.log.truncate_to(base + end)

    # ----------------------------------------------------------------- damage

    def _damaged(self, segment: Segment, damage: Damage, *, active: bool) -> None:
        """Report ``damage``; with ``repair``, copy the segment aside (once) and pad over
        it.  Bytes past a closed segment's end (the next one's base) are never read:
        zeros, or what a writer that lost its lock wrote late (see ``Log._fence``); they
        are cut unasked."""
        offset = segment.base_offset + damage.start
        kind, reason = damage.problem.kind, damage.problem.reason
        if kind is Kind.LONG_FILE and not active:
            if "zero" not in reason:
                reason += ", written late by a writer that had lost its lock (never served)"
            self.report.cut_bytes += damage.end - damage.start
            self.find(offset, segment.path, reason, self.would("cut"), kind)
            if self.act:
                segment.truncate_to(damage.start)
                self.log.fsync(segment)
            return
        if not self.repair:
            self.find(offset, segment.path, reason, "reported", kind)
            return
        if self.log.foreign(segment):
            self.find(offset, segment.path, f"{reason}; kl does not change segments of the other format", "reported", kind)
            return
        aside = self._copy_aside(segment)
        gap = damage.end - damage.start
        legacy = self.log.config.legacy
        if gap < padding_min(legacy):
            self.find(offset, segment.path, f"{reason}; {gap} bytes are too few to pad", "reported", kind)
            return
        count = segment.pad(damage.start, damage.end, legacy=legacy)
        self.log.fsync(segment)
        self.padded_active = self.padded_active or active
        how = f"{gap} bytes padded ({count} padding message{'s' if count != 1 else ''})"
        self.find(offset, segment.path, reason, f"repaired: {how}, original kept as {aside}", kind)

    def _keep_numbers(self, active: Segment) -> None:
        """After padding over damage in the active segment: publish its base count as the
        log end's count less the messages it holds now, so that the messages after the
        damage and the log end keep their Kafka offsets (those before move up by the
        number lost).  Not where the record has no counts, nor where the segment cannot
        be counted to the log end (damage too small to pad, a torn tail this run cuts):
        the messages after the damage are then numbered on from those before."""
        if not self.padded_active:
            return
        self.padded_active = False
        state = self.log.state()
        if state.log_end_count == UNKNOWN:
            return
        try:
            base_count = state.log_end_count - offsetindex.segment_count(active, state.log_end_offset - active.base_offset)
        except CorruptMessage:
            return
        if base_count != state.active_base_count:
            self.log.write_state(state._replace(active_base_count=base_count, boot_id=BOOT_ID))

    def _copy_aside(self, segment: Segment) -> str:
        aside = self.report.copies.get(segment.path)
        if aside is None:
            aside = f"{segment.path}{COPY_MARK}{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(3).hex()}"
            directory, name = os.path.split(aside)
            tmp = os.path.join(directory, f".{name}{TEMPORARY_SUFFIX}")  # whole or not there (see _temporary)
            try:
                shutil.copy2(segment.path, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.rename(tmp, aside)
                fsync_dir(directory)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise storage_error(e, "copy aside", segment.path) from None
            self.report.copies[segment.path] = aside
        return aside


def _size_damage(segment: Segment, size: int, expected: int) -> Iterator[Damage]:
    """Without reading messages: a closed segment shorter or longer than it must be."""
    if size < expected:
        where = segment.base_offset + size
        yield Damage(
            size,
            expected,
            Corruption(
                Kind.SHORT_FILE, f"file ends at offset {where}, before the next segment's base {segment.base_offset + expected}"
            ),
            False,
        )
    elif size > expected:
        yield from (d for d in segment.damage(expected, expected) if d.problem.kind is Kind.LONG_FILE)


def _last_message_end(segment: Segment) -> int:
    """Where the last valid message of a segment ends, stepping over damaged messages
    (by their length when it holds, else to the next place a valid message starts)."""
    size = segment.size_in_bytes()
    position: int | None = 0
    end = 0
    while position is not None and position < size:
        stop, count = segment.chain(position, size)
        if count:
            end = stop
        if stop >= size:
            break
        bad = segment.problem_at(stop, size)
        if bad.size > 0 and stop + bad.size < size and segment.chain(stop + bad.size, size)[1]:
            position = stop + bad.size
            continue
        position = next(segment.starts(stop + 1, size), None)
    return end


def _message_starts(segment: Segment, start: int, end: int) -> int:
    """Messages (complete, damaged or cut off) beginning in ``[start, end)``, as far as
    they can be told: each damaged one is stepped over to the proven resync point."""
    count, position = 0, start
    while position < end:
        stop, valid = segment.chain(position, end)
        count += valid
        if stop >= end:
            break
        count += 1
        bad = segment.problem_at(stop, end)
        found = segment.resync(bad, end)
        if found is None:
            break
        position = found
    return count
