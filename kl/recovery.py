"""Checking and repairing a partition after a crash (``kl recover``).

What is cut without being asked: bytes past the published log end (never acknowledged)
and a damaged tail past the stable offset (data a crash may tear; see ``Log.good_end``).
What is only reported: damage before the stable offset, which held committed, flushed
messages.  ``repair=True`` fixes that too, after copying the damaged segment aside: the
damaged bytes are overwritten by one padding message that readers skip, so every later
offset stays valid; only where no valid message follows is the log cut instead.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from kl import message as m
from kl.errors import CorruptState
from kl.fsutil import fsync_dir, pwrite_all, storage_error
from kl.log import Log, Segment
from kl.messageset import Entry
from kl.segment import list_segments, resync, scan, segment_name, segment_path
from kl.state import SIZE as STATE_SIZE
from kl.state import PartitionState


@dataclass
class Finding:
    """One problem: where, what, and what was done about it."""

    offset: int
    path: str
    reason: str
    action: str
    """"cut", "repaired", "removed", "rebuilt"; with ``dry_run`` "would cut", "would
    remove", "would rebuild"; or "reported": damage left as it is (``repair`` fixes it)."""


@dataclass
class RecoveryReport:
    directory: str
    checked_bytes: int = 0
    cut_bytes: int = 0
    cut_messages: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def unrepaired(self) -> list[Finding]:
        return [f for f in self.findings if f.action == "reported"]


def recover(log: Log, *, deep: bool = False, repair: bool = False, dry_run: bool = False) -> RecoveryReport:
    """Check ``log`` and cut or repair what is safe (nothing at all with ``dry_run``).

    ``deep`` checks every message of every segment and their continuity, not just the
    tail.  Safe while producers and consumers run: closed segments are read without the
    lock; the tail is checked and cut under it.
    """
    report = RecoveryReport(log.directory)
    act = not dry_run
    with log.locked():
        state = _state(log, report, act)
        segments = _segments(log, state, report, act)
        if deep:
            _check_closed(log, state, segments[:-1], report, act and repair)
        _check_active(log, state, segments[-1], report, act, deep, act and repair)
    return report


def _state(log: Log, report: RecoveryReport, act: bool) -> PartitionState:
    """The state record, rebuilt from the segments when it is missing or damaged."""
    try:
        with open(log.state_path, "rb") as f:
            return PartitionState.decode(f.read(STATE_SIZE), log.state_path)
    except (FileNotFoundError, CorruptState) as e:
        reason = str(e) if isinstance(e, CorruptState) else "state record is missing"
    found = list_segments(log.directory)
    if not found:
        found = [(0, segment_name(0))]
        if act:
            os.close(os.open(os.path.join(log.directory, found[0][1]), os.O_CREAT | os.O_WRONLY, 0o664))
    first, last = found[0][0], found[-1][0]
    path = os.path.join(log.directory, found[-1][1])
    end = 0
    if os.path.exists(path):
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            problem = _first_problem(f.fileno(), 0, end, log)
        end = end if problem is None else problem.position
    state = PartitionState(first, last, last + end, last + end, last + end, 0, time.time_ns() // 1_000_000)
    report.findings.append(Finding(last + end, log.state_path, reason, "rebuilt" if act else "would rebuild"))
    if act:
        _write_state(log, state)
    return state


def _write_state(log: Log, state: PartitionState) -> None:
    try:
        fd = os.open(log.state_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o664)
        try:
            pwrite_all(fd, state.encode(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(log.directory)
    except OSError as e:
        raise storage_error(e, "write", log.state_path) from None
    log.close()  # the writer's cached view is stale now


def _segments(log: Log, state: PartitionState, report: RecoveryReport, act: bool) -> list[Segment]:
    """The published segments; unpublished ones past the active segment are removed."""
    for base, name in list_segments(log.directory):
        if base > state.active_base_offset:
            path = os.path.join(log.directory, name)
            size = os.path.getsize(path)
            report.cut_bytes += size
            report.findings.append(
                Finding(base, path, "segment past the active one was never published", "removed" if act else "would remove")
            )
            if act:
                os.unlink(path)
    return log.segments(state)


def _check_closed(log: Log, state: PartitionState, segments: list[Segment], report: RecoveryReport, repair: bool) -> None:
    """Every message of every closed segment, and that each ends where the next begins."""
    for segment, following in zip(segments, segments[1:] + [None]):
        expected = (following.base_offset if following else state.active_base_offset) - segment.base_offset
        report.checked_bytes += segment.size_in_bytes
        while True:  # each repair may uncover the next damage in the same segment
            with open(segment.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                problem = _first_problem(f.fileno(), 0, size, log)
            if problem is None and size != expected:
                reason = f"segment holds {size} bytes but the next begins after {expected}"
                problem = Entry(min(size, expected), 0, -1, 0, reason)
            if problem is None or not _corruption(log, state, segment, expected, problem, report, repair):
                break


def _check_active(
    log: Log, state: PartitionState, active: Segment, report: RecoveryReport, act: bool, deep: bool, repair: bool
) -> None:
    base = state.active_base_offset
    with open(active.path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        stable = state.stable_offset - base
        if deep:
            report.checked_bytes += min(stable, file_size)
            while True:  # each repair may uncover the next damage
                problem = _first_problem(f.fileno(), 0, min(stable, file_size), log)
                if problem is None and file_size < stable:
                    problem = Entry(file_size, 0, -1, 0, f"file ends before the committed end {state.stable_offset}")
                if problem is None:
                    break
                if not _corruption(log, state, active, state.log_end_offset - base, problem, report, repair):
                    return
        report.checked_bytes += max(file_size - stable, 0)
        end, why = log.good_end(f.fileno(), state, file_size)
        if end < stable:
            if not deep:
                _corruption(log, state, active, state.log_end_offset - base, Entry(end, 0, -1, 0, why or ""), report, repair)
            return
        published = state.log_end_offset - base
        if end == file_size == published:
            return
        report.cut_bytes += file_size - end
        report.cut_messages += _message_starts(f.fileno(), end, file_size, log)
        reason = why or f"{file_size - end} bytes past the log end were never published"
        report.findings.append(Finding(base + end, active.path, reason, "cut" if act else "would cut"))
    if act:
        _truncate_active(log, state, end)


def _truncate_active(log: Log, state: PartitionState, end: int) -> None:
    base = state.active_base_offset
    path = segment_path(log.directory, base)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise storage_error(e, "truncate", path) from None
    log_end = base + end
    if log_end != state.log_end_offset:
        _write_state(
            log,
            state._replace(
                log_end_offset=log_end,
                flushed_offset=min(state.flushed_offset, log_end),
                last_append_offset=min(state.last_append_offset, log_end),
            ),
        )
    else:
        log.close()


def _first_problem(fd: int, start: int, end: int, log: Log) -> Entry | None:
    for entry in scan(fd, start, end, log.config.max_message_bytes):
        if entry.problem is not None:
            return entry
    return None


def _message_starts(fd: int, start: int, end: int, log: Log) -> int:
    """Messages (complete or not) beginning in ``[start, end)``, as far as they can be told."""
    count = 0
    for entry in scan(fd, start, end, log.config.max_message_bytes):
        count += 1
        if entry.problem is not None:
            break
    return count


def _corruption(
    log: Log, state: PartitionState, segment: Segment, expected: int, problem: Entry, report: RecoveryReport, repair: bool
) -> bool:
    """Report damage at ``problem.position`` of ``segment`` (which should hold ``expected``
    bytes); with ``repair``, copy the segment aside and pad over the damage, or, in the
    active segment when no valid message follows it, cut the log there.  True when the
    segment was padded (and may be checked again for more damage)."""
    offset = segment.base_offset + problem.position
    reason = problem.problem or "damaged"
    if not repair:
        report.findings.append(Finding(offset, segment.path, reason, "reported"))
        return False
    active = segment.base_offset == state.active_base_offset
    aside = f"{segment.path}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(3).hex()}"
    try:
        shutil.copy2(segment.path, aside)
        with open(segment.path, "r+b") as f:
            resume = resync(f.fileno(), problem.position + 1, expected, log.config.max_message_bytes)
            gap = (expected if resume is None else resume) - problem.position
            if gap >= m.HEADER_SIZE and not (active and resume is None):
                pwrite_all(f.fileno(), m.encode(b"\0" * (gap - m.HEADER_SIZE), None, 0, m.ATTR_PADDING), problem.position)
                os.fsync(f.fileno())
                report.findings.append(Finding(offset, segment.path, reason, f"repaired: {gap} bytes padded, original kept as {aside}"))
                return True
    except OSError as e:
        raise storage_error(e, "repair", segment.path) from None
    if not active or resume is not None:  # never cut valid messages that follow
        report.findings.append(Finding(offset, segment.path, f"{reason}; {gap} bytes are too few to pad", "reported"))
        return False
    _truncate_active(log, log.state(), problem.position)
    report.cut_bytes += expected - problem.position
    report.findings.append(Finding(offset, segment.path, reason, f"cut: nothing valid follows, original kept as {aside}"))
    return False
