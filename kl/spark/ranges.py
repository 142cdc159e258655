"""Offset ranges: which bytes of which partitions a Spark read covers (no Spark here).

A read is planned on the driver as one ``Range`` per topic-partition, from its starting
to its ending offset, both fixed when the query plans; ``split`` then cuts big ranges
at message boundaries so Spark gets more tasks.  Options are named as in Spark's Kafka
source: ``startingOffsets`` / ``endingOffsets`` are ``earliest``, ``latest`` or JSON
``{"topic": {"partition": offset}}`` where -2 means earliest and -1 latest.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from kl import timespec
from kl.errors import InvalidConfig, InvalidTime, KlError, TopicNotFound
from kl.log.log import EARLIEST, LATEST, Log
from kl.topic import Root

log = logging.getLogger(__name__)

Offsets = str | dict[str, dict[int, int]]
"""``"earliest"``, ``"latest"``, or per topic and partition a byte offset (or -2, -1)."""


class DataLoss(KlError):
    """Offsets a read needs were deleted by retention (``failOnDataLoss``)."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__(
            f"data loss: topic {topic!r} partition {partition} offsets {start} to {end} were deleted by retention"
            " (set failOnDataLoss to false to skip them)"
        )
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


ON_RECREATED = ("fail", "restart")
"""What a reader does when its topic was deleted and created again since its stored offsets."""


class Range(NamedTuple):
    """The bytes ``[start, end)`` of one partition: complete messages, read by one task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def select_topics(root: Root, topics: str | Iterable[str] | None, pattern: str | None) -> list[str]:
    """The topics a read covers: a comma-separated list (each must exist), or those matching a regex."""
    if (topics is None) == (pattern is None):
        raise InvalidConfig("give exactly one of the options topics and topicPattern")
    existing = root.topics()
    if pattern is not None:
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise InvalidConfig(f"topicPattern {pattern!r} is not a regular expression: {e}") from None
        return [t for t in existing if regex.fullmatch(t)]
    names = [t.strip() for t in topics.split(",")] if isinstance(topics, str) else list(topics or ())
    names = list(dict.fromkeys(t for t in names if t))
    if not names:
        raise InvalidConfig("the option topics names no topic")
    for name in names:
        if name not in existing:
            raise TopicNotFound(f"topic {name!r} does not exist in {root.path}")
    return names


def parse_offsets(text: str | None, option: str, default: str) -> Offsets:
    """An offsets option: ``earliest``, ``latest`` or JSON ``{"topic": {"partition": offset}}``."""
    if text is None or text.strip() in ("earliest", "latest"):
        return (text or default).strip()
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError("not an object")
        out: dict[str, dict[int, int]] = {}
        for topic, partitions in parsed.items():
            if not isinstance(partitions, dict):
                raise ValueError(f"topic {topic!r} does not map to an object")
            out[topic] = {}
            for p, offset in partitions.items():
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                    raise ValueError(f"offset {offset!r} of {topic}/{p} is not a byte offset, -1 or -2")
                out[topic][int(p)] = offset
        return out
    except ValueError as e:
        raise InvalidConfig(f'{option} must be earliest, latest or JSON such as {{"t": {{"0": 23}}}}: {e}') from None


def parse_timestamp(text: str | None, option: str, now: float | None = None) -> int | None:
    """A time option in any form ``kl.timespec.parse_time`` reads (relative ones count
    from ``now``: when the options are read), as milliseconds since the epoch."""
    if text is None:
        return None
    try:
        return timespec.parse_time(text, now=now)
    except InvalidTime as e:
        raise InvalidTime(f"{option}: {e}") from None


def plan(
    root: Root,
    topics: list[str],
    *,
    starting: Offsets = "earliest",
    ending: Offsets = "latest",
    starting_timestamp: int | None = None,
    ending_timestamp: int | None = None,
    fail_on_data_loss: bool = True,
    on_loss: Callable[[DataLoss], None] | None = None,
) -> list[Range]:
    """One range per partition of ``topics``, its end fixed now (a busy topic still ends).

    A start below the log start (retention deleted it) raises ``DataLoss``, or without
    ``fail_on_data_loss`` moves up to the log start and reports the loss to ``on_loss``
    (by default a logged warning).  Raises ``InvalidConfig`` for offsets that name no
    partition or lie past the log end.
    """
    ranges = []
    for topic in topics:
        for partition in range(root.config(topic).partitions):
            partition_log = root.log(topic, partition)
            state = partition_log.state()
            first, last = state.log_start_offset, state.log_end_offset
            start = _resolve(partition_log, starting, starting_timestamp, topic, partition, "startingOffsets")
            end = _resolve(partition_log, ending, ending_timestamp, topic, partition, "endingOffsets")
            if start < first:
                loss = DataLoss(topic, partition, start, first)
                if fail_on_data_loss:
                    raise loss
                (on_loss or log_loss)(loss)
                start = first
            if start > end:
                raise InvalidConfig(f"{topic}/{partition}: starting offset {start} is past the ending offset {end}")
            for offset, spec in ((start, starting), (end, ending)):
                if offset not in (first, last) and isinstance(spec, dict):
                    partition_log.check_offset(offset)
            ranges.append(Range(topic, partition, start, end))
    _check_named(starting, topics, "startingOffsets", root)
    _check_named(ending, topics, "endingOffsets", root)
    return ranges


def _resolve(partition_log: Log, spec: Offsets, stamp: int | None, topic: str, partition: int, option: str) -> int:
    """The byte offset an offsets option (or a timestamp) gives one partition."""
    state = partition_log.state()
    if stamp is not None:
        return partition_log.offset_for_time(stamp)
    if isinstance(spec, str):
        return state.log_start_offset if spec == "earliest" else state.log_end_offset
    offset = spec.get(topic, {}).get(partition, EARLIEST if option == "startingOffsets" else LATEST)
    if offset == EARLIEST:
        return state.log_start_offset
    if offset == LATEST:
        return state.log_end_offset
    if offset > state.log_end_offset:
        raise InvalidConfig(f"{option} {offset} of {topic}/{partition} is past the log end {state.log_end_offset}")
    return offset


def _check_named(spec: Offsets, topics: list[str], option: str, root: Root) -> None:
    """JSON offsets may name only topics and partitions the read covers."""
    if isinstance(spec, str):
        return
    for topic, partitions in spec.items():
        if topic not in topics:
            raise InvalidConfig(f"{option} names topic {topic!r}, which the read does not cover")
        count = root.config(topic).partitions
        for p in partitions:
            if not 0 <= p < count:
                raise InvalidConfig(f"{option} names partition {p} of {topic!r}, which has partitions 0 to {count - 1}")


def log_loss(loss: DataLoss) -> None:
    log.warning("skipping %s/%d offsets %d to %d: deleted by retention", loss.topic, loss.partition, loss.start, loss.end)


def split(root: Root, ranges: list[Range], *, min_partitions: int = 0, max_bytes: int = 0) -> list[Range]:
    """Cut ranges at message boundaries into pieces of at most ``max_bytes`` (0: no
    limit), and small enough that there are at least ``min_partitions`` of them."""
    total = sum(r.size for r in ranges)
    target = max_bytes or total or 1
    if min_partitions > len(ranges) and total:
        target = min(target, max(1, -(-total // min_partitions)))
    out: list[Range] = []
    for r in ranges:
        out.extend(_cut(root, r, target) if r.size > target else [r])
    return out


def split_at_segments(root: Root, ranges: list[Range], max_bytes: int) -> list[Range]:
    """Cut ranges at segment starts only, into runs of whole segments of at most
    ``max_bytes`` (a bigger segment stays one piece).  Reads no segment: the cost grows
    with the partitions and their files, not with the messages (``split`` finds a
    message boundary near each cut by walking up to ``max_bytes`` of messages)."""
    out: list[Range] = []
    for r in ranges:
        if r.size <= max_bytes:
            out.append(r)
            continue
        bases = [s.base_offset for s in root.log(r.topic, r.partition).segments() if r.start < s.base_offset < r.end]
        start = r.start
        for base, following in itertools.pairwise([*bases, r.end]):
            if following - start > max_bytes:
                out.append(Range(r.topic, r.partition, start, base))
                start = base
        out.append(Range(r.topic, r.partition, start, r.end))
    return out


def _cut(root: Root, r: Range, target: int) -> list[Range]:
    """Cut one range into pieces near ``target`` bytes (see ``boundary``); damage stops
    the cutting, and the task reading the rest meets it."""
    partition_log = root.log(r.topic, r.partition)
    bases = [s.base_offset for s in partition_log.segments()]
    pieces, start = [], r.start
    while r.end - start > target:
        cut = boundary(partition_log, bases, start, start + target, r.end)
        if cut is None:
            break
        pieces.append(Range(r.topic, r.partition, start, cut))
        start = cut
    if start < r.end:
        pieces.append(Range(r.topic, r.partition, start, r.end))
    return pieces


def boundary(partition_log: Log, bases: list[int], start: int, want: int, end: int) -> int | None:
    """A message boundary in ``(start, end]`` near ``want``: the last segment start up to
    it, else the start of the message straddling it, else (a message bigger than
    ``want - start``) the end of the message at ``start``.  None at damage."""
    cut = max((b for b in bases if start < b <= want), default=None)
    if cut is not None:
        return cut
    base = max((b for b in bases if b <= start), default=start)
    with partition_log.open_segment(base) as segment:
        cut = base + segment.chain(start - base, want - base)[0]
        if cut > start:
            return cut
        entry = next(segment.scan(start - base, end - base), None)
    if entry is None or entry.problem is not None:
        return None
    return min(start + entry.size, end)


def cap(root: Root, r: Range, *, max_bytes: int = 0, max_messages: int = 0) -> Range:
    """``r`` cut short at a message boundary to hold at most ``max_bytes`` bytes and
    ``max_messages`` stored messages (a compressed batch counts as one), but at least
    one message, so that a capped reader always moves on (0: no limit)."""
    partition_log = root.log(r.topic, r.partition)
    end = r.end
    if max_bytes and r.size > max_bytes:
        bases = [s.base_offset for s in partition_log.segments()]
        end = boundary(partition_log, bases, r.start, r.start + max_bytes, r.end) or r.end
    if max_messages:
        position, count = r.start, 0
        for info in partition_log.segments():
            stop = min(end, info.base_offset + info.size_in_bytes)
            if stop <= position:
                continue
            if count == max_messages:
                break
            with partition_log.open_segment(info.base_offset) as segment:
                for entry in segment.scan(position - info.base_offset, stop - info.base_offset):
                    if entry.problem is not None:
                        return r._replace(end=end)  # the reader meets the damage
                    position, count = info.base_offset + entry.position + entry.size, count + 1
                    if count == max_messages:
                        break
        end = min(end, position)
    return r._replace(end=end)
