"""A root's figures read from its files alone: per partition its log start and end (byte
offsets and Kafka offsets), size and segments; per group and partition its committed
offset and lag (``kl.groups.describe``).  What ``kl metrics`` shows over time, and what
``Collector`` exports as Prometheus gauges, named as kafka_exporter names them.

A snapshot reads each partition's state record, lists its directory and, where the
record carries no message counts (one an older kl wrote), counts them; each committed
offset costs the lag's reads as well (``kl.groups``: its Kafka offset, and the first
unconsumed message for the lag in time).  Nothing is written, nothing locked (but that
``kl.groups.describe`` deletes the registrations of dead members, as every reader of a
group does).  A partition whose files cannot be read is left out and counted
(``Snapshot.unreadable``; logged once, while it stays so), and in a group it is a row of
status ``UNREADABLE``; a topic deleted meanwhile is simply gone.  A snapshot is not
atomic: each partition is read at its own moment (a group's lag counts to the log ends
the snapshot read, though).

Snapshots taken again and again (``kl metrics``, a collector scraped every few seconds)
share a ``Cursor``: a committed offset that did not move is not looked up again, and a
snapshot that runs out of its ``budget`` of seconds gives the partitions and groups it
had no time for as last read (``Snapshot.skipped``, ``groups_skipped``) and the next one
starts where it stopped, so every one is read in turn, however many there are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kl.errors import CorruptMessage, KlError, TopicNotFound
from kl.groups import GroupInfo, LagMemo, PartitionLag, RootLike, Status, describe, existing_root, list_groups
from kl.log.state import PartitionState
from kl.registry import GroupNotFound
from kl.topic import Root

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["Collector", "Cursor", "GroupFigures", "PartitionStats", "Snapshot", "TopicFigures", "figures", "gauges", "snapshot"]

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 1.0
"""Seconds a collector's snapshot may spend reading the root (see ``snapshot``)."""

Filter = Callable[[str], bool]


@dataclass(frozen=True)
class PartitionStats:
    """One partition as its files have it."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    log_start_kafka_offset: int | None
    """None where the messages cannot be counted (damaged data): also for the log end."""
    log_end_kafka_offset: int | None
    size_in_bytes: int
    segments: int


@dataclass(frozen=True)
class Snapshot:
    time_ms: int
    """When it began (this host's clock)."""
    topics: dict[str, int]
    """Partitions of each topic."""
    partitions: list[PartitionStats]
    groups: list[GroupInfo]
    """Each group with the rows of the topics taken (``kl.groups.describe``)."""
    skipped: int = 0
    """Partitions not read: the time budget ran out (read first by the next snapshot)."""
    unreadable: int = 0
    """Partitions (and groups) left out: their files could not be read (each is logged)."""
    seconds: float = 0.0
    """How long it took."""
    groups_skipped: int = 0
    """Groups not described: the time budget ran out (given as last described)."""


@dataclass
class Cursor:
    """Where the next snapshot starts reading partitions (after the last one read)."""

    after: tuple[str, int] | None = None
    last: dict[tuple[str, int], PartitionStats] = field(default_factory=dict)
    """Each partition's figures as last read: what a snapshot that runs out of time gives
    for those it did not reach."""
    ids: dict[str, str] = field(default_factory=dict)
    """The topic id of each topic as last read."""
    lags: dict[str, LagMemo] = field(default_factory=dict)
    """Per group, what its lag read last (``kl.groups.describe``'s ``memo``)."""
    unreadable: set[str] = field(default_factory=set)
    """What the last snapshot could not read (warned about once, while it stays so)."""
    group_after: str | None = None
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    """Each group as last described (given for those a snapshot had no time for)."""


def snapshot(
    root: RootLike,
    topics: Filter | None = None,
    groups: Filter | None = None,
    *,
    budget: float | None = None,
    cursor: Cursor | None = None,
) -> Snapshot:
    """The figures of the topics ``topics`` takes (all by default) and of the groups
    ``groups`` takes, read within ``budget`` seconds (None: no bound), partitions first,
    then groups: once it is spent, those left are given as the ``cursor`` last had them
    (a partition it never read is left out) and counted (``skipped``,
    ``groups_skipped``); at least one partition and one group are read, and every group
    not described before.  The next snapshot with the ``cursor`` starts after the last
    partition and the last group read.  Raises ``RootNotFound``; no error of one
    partition or group stops it."""
    began, clock = time.time_ns() // 1_000_000, time.monotonic()
    r = existing_root(root)
    cursor = cursor or Cursor()
    counts, keys = _topics(r, topics, cursor)
    start = 0 if cursor.after is None else next((i for i, key in enumerate(keys) if key > cursor.after), 0)
    found: dict[tuple[str, int], PartitionStats] = {}
    states: dict[tuple[str, int], PartitionState] = {}
    """As read for ``found``: the groups' lag is counted to the same log ends."""
    unreadable: set[str] = set()
    skipped = 0
    for i in range(len(keys)):
        key = keys[(start + i) % len(keys)]
        if budget is not None and i and time.monotonic() - clock > budget:  # (one is read whatever the budget)
            skipped = len(keys) - i
            for rest in range(i, len(keys)):
                old = cursor.last.get(keys[(start + rest) % len(keys)])
                if old is not None:
                    found[old.topic, old.partition] = old
            break
        try:
            found[key], states[key] = _partition(r, *key)
        except TopicNotFound:
            continue  # deleted meanwhile
        except (KlError, OSError) as e:
            _unreadable(cursor, unreadable, f"{key[0]}/{key[1]}", e)
        cursor.after = key
    cursor.last = found
    names = [name for name in list_groups(r) if groups is None or groups(name)]
    first = 0 if cursor.group_after is None else next((i for i, name in enumerate(names) if name > cursor.group_after), 0)
    described: dict[str, GroupInfo] = {}
    lags, groups_skipped = {}, 0
    for i in range(len(names)):
        name = names[(first + i) % len(names)]
        lags[name] = cursor.lags.get(name, {})
        if budget is not None and i and name in cursor.groups and time.monotonic() - clock > budget:
            groups_skipped += 1  # (one is described whatever the budget, and each new one)
            described[name] = cursor.groups[name]
            continue
        try:
            described[name] = describe(r, name, topics, states, lags[name])
        except GroupNotFound:
            continue  # deleted meanwhile
        except (KlError, OSError) as e:
            _unreadable(cursor, unreadable, f"group {name}", e)
        cursor.group_after = name
    cursor.lags, cursor.groups, cursor.unreadable = lags, described, unreadable
    partitions = [found[key] for key in keys if key in found]
    listed = [described[name] for name in names if name in described]
    took = time.monotonic() - clock
    return Snapshot(began, counts, partitions, listed, skipped, len(unreadable), took, groups_skipped)


def _unreadable(cursor: Cursor, found: set[str], what: str, error: Exception) -> None:
    found.add(what)
    if what not in cursor.unreadable:
        log.warning("stats of %s left out: %s", what, error)


def _topics(root: Root, taken: Filter | None, cursor: Cursor) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Partition counts of the topics taken, and their partitions, sorted.  The root's
    handles of a topic deleted, or created again, since the last snapshot are dropped."""
    counts = {}
    for topic in root.topics():
        if taken is None or taken(topic):
            try:
                config = root.read_config(topic)
                if topic in cursor.ids and cursor.ids[topic] != config.topic_id:
                    root.forget(topic)  # created again: the handles are of the old one
                cursor.ids[topic] = config.topic_id
                counts[topic] = config.partitions
            except TopicNotFound:
                continue  # deleted meanwhile
            except (KlError, OSError) as e:
                log.warning("stats of topic %s left out: %s", topic, e)
    for topic in [t for t in cursor.ids if t not in counts]:
        root.forget(topic)
        del cursor.ids[topic]
    return counts, [(topic, p) for topic, n in counts.items() for p in range(n)]


def _partition(root: Root, topic: str, partition: int) -> tuple[PartitionStats, PartitionState]:
    log = root.log(topic, partition)
    state = log.state()
    segments = log.segments(state)
    counts: tuple[int | None, int | None]
    try:
        counts = log.kafka_offsets(state)
    except CorruptMessage:
        counts = None, None
    size = sum(s.size_in_bytes for s in segments)
    start, end = state.log_start_offset, state.log_end_offset
    return PartitionStats(topic, partition, start, end, counts[0], counts[1], size, len(segments)), state


# ----------------------------------------------------------------- over time


@dataclass(frozen=True)
class TopicFigures:
    """A topic in a snapshot, and its growth since the one before (None: not known)."""

    topic: str
    partitions: int
    records: int | None
    """Its partitions' log ends as Kafka offsets, summed: the records ever appended (None
    where one cannot be counted)."""
    log_end_offset: int
    """Its partitions' log ends as byte offsets, summed: the bytes ever appended."""
    size_in_bytes: int
    records_in: int | None = None
    bytes_in: int | None = None
    seconds: float | None = None
    """Between the two snapshots."""

    @property
    def records_per_second(self) -> float | None:
        return _rate(self.records_in, self.seconds)

    @property
    def bytes_per_second(self) -> float | None:
        return _rate(self.bytes_in, self.seconds)


@dataclass(frozen=True)
class GroupFigures:
    """A group's lag on one topic in a snapshot, and its change since the one before."""

    group: str
    topic: str
    members: int
    """The group's live members (a group of Kafka clients: its coordinators)."""
    lag: int | None
    """Records from the committed offsets to the log ends, summed (None: none known)."""
    lag_bytes: int | None
    lag_ms: int | None
    """The age of the oldest record not consumed (0: caught up; None: not known)."""
    lag_change: int | None = None
    seconds: float | None = None

    @property
    def lag_per_second(self) -> float | None:
        return _rate(self.lag_change, self.seconds)


def figures(snap: Snapshot, before: Snapshot | None = None) -> tuple[list[TopicFigures], list[GroupFigures]]:
    """Per topic and per group and topic, the snapshot's figures and their change since
    ``before``.  A partition's growth counts from 0 where its end went back (its topic
    was created again) and is not counted where ``before`` had no figures of it."""
    seconds = None if before is None else (snap.time_ms - before.time_ms) / 1000
    old = {} if before is None else {(p.topic, p.partition): p for p in before.partitions}
    topics: dict[str, list[PartitionStats]] = {topic: [] for topic in snap.topics}
    for p in snap.partitions:
        topics.setdefault(p.topic, []).append(p)
    out = []
    for topic, partitions in topics.items():
        ends = [p.log_end_kafka_offset for p in partitions]
        records = None if None in ends else sum(e for e in ends if e is not None)
        grown = [(p, old[p.topic, p.partition]) for p in partitions if (p.topic, p.partition) in old]
        known = before is not None and topic in before.topics
        out.append(
            TopicFigures(
                topic,
                snap.topics.get(topic, len(partitions)),
                records,
                sum(p.log_end_offset for p in partitions),
                sum(p.size_in_bytes for p in partitions),
                _growth([(p.log_end_kafka_offset, q.log_end_kafka_offset) for p, q in grown]) if known else None,
                _growth([(p.log_end_offset, q.log_end_offset) for p, q in grown]) if known else None,
                seconds,
            )
        )
    lags = [_group_figures(info) for info in snap.groups]
    previous = {} if before is None else {(g.group, g.topic): g for info in before.groups for g in _group_figures(info)}
    rows = []
    for each in lags:
        for g in each:
            was = previous.get((g.group, g.topic))
            change = None if was is None or was.lag is None or g.lag is None else g.lag - was.lag
            rows.append(GroupFigures(g.group, g.topic, g.members, g.lag, g.lag_bytes, g.lag_ms, change, seconds))
    return out, rows


def _group_figures(info: GroupInfo) -> list[GroupFigures]:
    by_topic: dict[str, list[PartitionLag]] = {}
    for p in info.partitions:
        by_topic.setdefault(p.topic, []).append(p)
    rows = []
    for topic, partitions in by_topic.items():
        counted = [p for p in partitions if p.status in (Status.OK, Status.BEFORE_START) and p.lag_messages is not None]
        ages = [0 if p.lag_messages == 0 else p.lag_ms for p in counted]
        rows.append(
            GroupFigures(
                info.group,
                topic,
                len(info.members),
                sum(p.lag_messages or 0 for p in counted) if counted else None,
                sum(p.lag_bytes or 0 for p in counted) if counted else None,
                None if not ages or None in ages else max(a for a in ages if a is not None),
            )
        )
    return rows


def _growth(pairs: list[tuple[int | None, int | None]]) -> int | None:
    """Summed growth of (now, before) ends: from 0 where an end went back."""
    if any(now is None or was is None for now, was in pairs):
        return None
    return sum(now - was if now >= was else now for now, was in pairs if now is not None and was is not None)


def _rate(amount: int | None, seconds: float | None) -> float | None:
    return None if amount is None or not seconds else amount / seconds


# ----------------------------------------------------------------- Prometheus


class Collector:
    """A ``prometheus_client`` collector of a root's snapshot: register it in a
    ``CollectorRegistry``; each scrape takes a snapshot (within ``budget`` seconds, see
    ``snapshot``; the partitions it had no time for keep their last figures) of the
    topics ``topics`` takes.

    Names and labels are kafka_exporter's (``kafka_topic_partition_current_offset``,
    ``kafka_consumergroup_lag``, ...; offsets and lags in Kafka offsets, that is
    records); what it has no name for is ``kl_``-prefixed (byte offsets, sizes, lag in
    bytes and seconds, the scrape's own cost).  ``kafka_consumergroup_members`` counts
    kl's members; a group of Kafka clients (coordinated by ``kl serve --kafka``, which
    keeps its members in memory) has none in its files and no such gauge.  Safe across
    threads: scrapes take turns."""

    def __init__(self, root: RootLike, topics: Filter | None = None, *, budget: float = DEFAULT_BUDGET):
        self.root = existing_root(root)
        self.topics = topics
        self.budget = budget
        self._cursor = Cursor()
        self._turn = threading.Lock()

    def describe(self) -> list[Metric]:
        """No metrics known before a scrape (so registering takes no snapshot)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The gauges of a snapshot taken now.  Never raises (a root gone, say, gives the
        scrape's own gauges only, and is logged)."""
        with self._turn:
            try:
                snap = snapshot(self.root, self.topics, budget=self.budget, cursor=self._cursor)
            except (KlError, OSError) as e:
                log.warning("stats of %s: %s", self.root.path, e)
                snap = Snapshot(time.time_ns() // 1_000_000, {}, [], [], unreadable=1)
        yield from gauges(snap)


def gauges(snap: Snapshot) -> Iterator[Metric]:
    """The snapshot's figures as Prometheus metric families (see ``Collector``)."""
    from prometheus_client.core import GaugeMetricFamily as Gauge

    tp, tpp = ["topic"], ["topic", "partition"]
    families = {
        "partitions": Gauge("kafka_topic_partitions", "Number of partitions for this topic", labels=tp),
        "current": Gauge("kafka_topic_partition_current_offset", "Current offset of a partition (its log end)", labels=tpp),
        "oldest": Gauge("kafka_topic_partition_oldest_offset", "Oldest offset of a partition (its log start)", labels=tpp),
        "start_bytes": Gauge("kl_topic_partition_log_start_offset_bytes", "Log start as a byte offset", labels=tpp),
        "end_bytes": Gauge("kl_topic_partition_log_end_offset_bytes", "Log end as a byte offset", labels=tpp),
        "size": Gauge("kl_topic_partition_size_bytes", "Bytes of the partition's segments", labels=tpp),
    }
    for topic, count in snap.topics.items():
        families["partitions"].add_metric([topic], count)
    for p in snap.partitions:
        labels = [p.topic, str(p.partition)]
        if p.log_end_kafka_offset is not None and p.log_start_kafka_offset is not None:
            families["current"].add_metric(labels, p.log_end_kafka_offset)
            families["oldest"].add_metric(labels, p.log_start_kafka_offset)
        families["start_bytes"].add_metric(labels, p.log_start_offset)
        families["end_bytes"].add_metric(labels, p.log_end_offset)
        families["size"].add_metric(labels, p.size_in_bytes)
    yield from families.values()
    yield from _group_gauges(snap.groups)
    skipped = Gauge("kl_stats_partitions_skipped", "Partitions this scrape left out, and why", labels=["reason"])
    skipped.add_metric(["time budget"], snap.skipped)
    skipped.add_metric(["unreadable"], snap.unreadable)
    yield skipped
    yield Gauge(
        "kl_stats_groups_skipped", "Groups this scrape had no time for (given as last described)", value=snap.groups_skipped
    )
    yield Gauge("kl_stats_scrape_seconds", "Seconds this scrape spent reading the root", value=snap.seconds)


def _group_gauges(groups: list[GroupInfo]) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily as Gauge

    gtp = ["consumergroup", "topic", "partition"]
    current = Gauge("kafka_consumergroup_current_offset", "Current offset of a consumer group at a partition", labels=gtp)
    current_bytes = Gauge("kl_consumergroup_current_offset_bytes", "A group's committed byte offset", labels=gtp)
    lag = Gauge("kafka_consumergroup_lag", "Current approximate lag of a consumer group at a partition", labels=gtp)
    lag_sum = Gauge("kafka_consumergroup_lag_sum", "Current approximate lag of a consumer group at a topic", labels=gtp[:2])
    lag_bytes = Gauge("kl_consumergroup_lag_bytes", "Bytes from a group's committed offset to the log end", labels=gtp)
    lag_seconds = Gauge("kl_consumergroup_lag_seconds", "Age of a group's oldest unconsumed message", labels=gtp)
    members = Gauge("kafka_consumergroup_members", "Amount of members in a consumer group", labels=gtp[:1])
    for info in groups:
        kl_members = [m for m in info.members if "kafka" not in m.subscription]
        if kl_members or len(kl_members) == len(info.members):
            members.add_metric([info.group], len(kl_members))
        sums: dict[str, int] = {}
        for p in info.partitions:
            if p.status not in (Status.OK, Status.BEFORE_START) or p.committed is None:
                continue
            labels = [info.group, p.topic, str(p.partition)]
            current_bytes.add_metric(labels, p.committed)
            if p.lag_bytes is not None:
                lag_bytes.add_metric(labels, p.lag_bytes)
            if p.committed_kafka_offset is not None:
                current.add_metric(labels, p.committed_kafka_offset)
            if p.lag_messages is not None:
                lag.add_metric(labels, p.lag_messages)
                sums[p.topic] = sums.get(p.topic, 0) + p.lag_messages
                if p.lag_messages == 0 or p.lag_ms is not None:
                    lag_seconds.add_metric(labels, (p.lag_ms or 0) / 1000)
        for topic, total in sums.items():
            lag_sum.add_metric([info.group, topic], total)
    yield from (current, current_bytes, lag, lag_sum, lag_bytes, lag_seconds, members)
