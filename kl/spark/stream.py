"""The ``kl`` streaming source: ``spark.readStream.format("kl")`` (pyspark 4.0+).

    spark.readStream.format("kl").option("root", R).option("topics", "a").load()

An offset is JSON ``{"topic": {"id": topic_id, "partition": next_offset}}``: the topic's
id (which creation of the topic the offsets are of) and for each partition the byte
offset the next micro-batch starts at.  Offsets of another creation of a topic (deleted
and created again) fail the query with ``TopicRecreated``, or with ``onRecreated`` set to
``restart`` the stream reads the new topic from its start; offsets without an id (written
by a kl before topic ids) count as the current creation's.  A stream starts at ``startingOffsets``
(default ``latest``, as Spark's Kafka source does), a partition that appears later
(a new topic matching ``topicPattern``) at its first byte.  ``maxOffsetsPerTrigger``
(stored messages) and ``maxBytesPerTrigger`` cap a micro-batch, shared among the
partitions in proportion to their lag; they and ``trigger(availableNow=True)`` in
several capped batches need pyspark 4.2 or newer, where ``latestOffset`` is given the
start and a read limit.  On older pyspark a cap is refused, and Spark runs
``availableNow`` as one batch up to the end found when the query starts.

kl keeps no consumer state: the offsets live in Spark's checkpoint only, and ``commit``
has nothing to do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
import pyspark
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from kl.errors import InvalidConfig, KlError, TopicRecreated
from kl.log.config import same_creation
from kl.spark import ranges
from kl.spark.batch import KlPartition, read_partition
from kl.spark.options import Options
from kl.spark.ranges import DataLoss, Range
from kl.topic import Root

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
    """This pyspark hands ``latestOffset`` the start and a read limit (4.2 and newer)."""
except ImportError:  # pyspark 4.0 and 4.1: latestOffset() alone, no limits, no availableNow hook
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's read limits, which older pyspark never passes."""

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for pyspark 4.2's availableNow mixin (older Spark runs availableNow as one batch)."""


log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int | str]]
"""A stream offset: per topic its id (key ``ID``) and per partition (a string, as in
JSON) the next byte offset."""
ID = "id"
"""The key of a topic's id among its partitions (which are numbers)."""
REMEDY = "start a new checkpoint, or set the option onRecreated to restart to read the new topic from its start"

BATCH_ONLY = ("endingOffsets", "endingTimestamp", "ranges")


class PysparkTooOld(KlError):
    """The installed pyspark cannot do what an option asks."""


def stream_options(options: Mapping[str, str]) -> Options:
    """The source's options for a stream: ``startingOffsets`` defaults to ``latest``, the
    batch-only options are refused, and so are the caps where pyspark cannot honour them."""
    given = {key.lower() for key in options}
    for option in BATCH_ONLY:
        if option.lower() in given:
            raise InvalidConfig(f"{option} is for batch reads (spark.read); a stream reads on as data arrives")
    parsed = Options.parse({"startingOffsets": "latest", **{key.lower(): value for key, value in options.items()}})
    caps = {"maxOffsetsPerTrigger": parsed.max_offsets_per_trigger, "maxBytesPerTrigger": parsed.max_bytes_per_trigger}
    for option, value in caps.items():
        if value and not ADMISSION_CONTROL:
            raise PysparkTooOld(f"{option} needs pyspark 4.2 or newer; this is pyspark {pyspark.__version__}")
    return parsed


class KlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver from the partitions' published ends."""

    def __init__(self, options: Options):
        self.options = options
        self.target: Offsets | None = None
        """availableNow's end, fixed by ``prepareForTriggerAvailableNow``."""

    def initialOffset(self) -> Offsets:
        """Where a new query starts: ``startingOffsets`` or ``startingTimestamp``."""
        with self._root() as root:
            topics = self._topics(root)
            ids = {topic: root.config(topic).topic_id for topic in topics}  # before the logs' states
            planned = ranges.plan(
                root,
                topics,
                starting=self.options.starting,
                starting_timestamp=self.options.starting_timestamp,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
        return _offsets(ids, ((r.topic, r.partition, r.start) for r in planned))

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix availableNow's end: every partition's end now; later data waits for the next run."""
        with self._root() as root:
            self.target = self._ends(root)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The cap the options ask for (``maxOffsetsPerTrigger`` first; both apply)."""
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offsets | None = None, limit: ReadLimit | None = None) -> Offsets:
        """The next micro-batch's end: each partition's end (or availableNow's), capped
        by ``limit``.  Partitions of ``start`` no longer read keep their offsets; a topic
        of ``start`` created again since fails (``TopicRecreated``) or, with
        ``onRecreated=restart``, is read from its start.  (pyspark before 4.2 passes
        neither ``start`` nor ``limit``.)"""
        with self._root() as root:
            ends = self._ends(root) if self.target is None else self._target(root)
            if start is None:
                return ends
            max_messages, max_bytes = self._caps(limit)
            out = {topic: dict(partitions) for topic, partitions in start.items()}
            lags = []
            for topic, partitions in ends.items():
                kept = start.get(topic, {})
                if self._recreated(topic, _id(kept), _id(partitions)):
                    kept = out[topic] = {}
                if ID in partitions:
                    out.setdefault(topic, {})[ID] = partitions[ID]
                for p, end in _numbered(partitions):
                    begin = _start(root, topic, p, _number(kept.get(p, 0)), end, self.options.fail_on_data_loss)
                    out.setdefault(topic, {})[p] = max(begin, end)
                    if begin < end:
                        lags.append(Range(topic, int(p), begin, end))
            total = sum(r.size for r in lags)
            if max_messages or max_bytes:
                for r in lags:
                    share = {"max_bytes": _share(max_bytes, r, total), "max_messages": _share(max_messages, r, total)}
                    out[r.topic][str(r.partition)] = ranges.cap(root, r, **share).end
        return out

    def reportLatestOffset(self) -> Offsets:
        """Every partition's end now (for the query's progress)."""
        with self._root() as root:
            return self._ends(root)

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        """One task per partition that has data in ``[start, end)`` (split as
        ``minPartitions`` and ``maxBytesPerPartition`` ask).  Bytes deleted by retention
        since fail (``failOnDataLoss``) or are skipped, logged.  A topic created again
        since ``end`` was planned fails the batch, or with ``onRecreated=restart`` is
        left out of it (its offsets then lead the next batch to the new topic's start)."""
        planned = []
        with self._root() as root:
            for topic, partitions in end.items():
                kept = start.get(topic, {})
                if self._recreated(topic, _id(kept), _id(partitions)):  # (pyspark before 4.2 gives latestOffset no start)
                    kept = {}
                work = [(p, _number(kept.get(p, 0)), stop) for p, stop in _numbered(partitions)]
                work = [(p, begin, stop) for p, begin, stop in work if begin < stop]
                if work and self._recreated(topic, _id(partitions), root.config(topic).topic_id):
                    log.warning("topic %s was created again: its batch of the old topic is gone, left out", topic)
                    continue
                for p, begin, stop in work:
                    first = root.log(topic, int(p)).state().log_start_offset
                    if begin < first:
                        loss = DataLoss(topic, int(p), begin, min(first, stop))
                        if self.options.fail_on_data_loss:
                            raise loss
                        ranges.log_loss(loss)
                        begin = min(first, stop)
                    planned.append(Range(topic, int(p), begin, stop))
            pieces = ranges.split(
                root, planned, min_partitions=self.options.min_partitions, max_bytes=self.options.max_bytes_per_partition
            )
        return [KlPartition(r) for r in pieces if r.size]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: kl keeps no consumer state, Spark's checkpoint holds the offsets."""

    def _recreated(self, topic: str, recorded: str, current: str) -> bool:
        """Whether offsets recorded with topic id ``recorded`` are of another creation of
        the topic than ``current``'s: then ``TopicRecreated``, or True with ``onRecreated=restart``."""
        if same_creation(recorded, current):
            return False
        if self.options.on_recreated != "restart":
            raise TopicRecreated(topic, str(recorded), str(current), "checkpoint", REMEDY)
        log.warning("topic %s was deleted and created again: reading the new topic from its start", topic)
        return True

    def _target(self, root: Root) -> Offsets:
        """availableNow's end, the end now for a topic created again since it was fixed."""
        assert self.target is not None
        for topic, partitions in self.target.items():
            if self._recreated(topic, _id(partitions), root.config(topic).topic_id):
                self.target[topic] = self._ends(root, [topic])[topic]
        return self.target

    def _caps(self, limit: ReadLimit | None) -> tuple[int, int]:
        """(messages, bytes) a micro-batch may hold; 0: no cap.  ``ReadAllAvailable``
        (Trigger.Once, or Spark's own choice) lifts the options' caps."""
        if limit is None or isinstance(limit, ReadAllAvailable):
            return 0, 0
        messages = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_offsets_per_trigger
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes_per_trigger
        return messages, size

    @contextlib.contextmanager
    def _root(self) -> Iterator[Root]:
        """A fresh view of the root (configs are cached per ``Root``), closed after use."""
        root = Root(self.options.root)
        try:
            yield root
        finally:
            root.close()

    def _topics(self, root: Root) -> list[str]:
        return ranges.select_topics(root, self.options.topics, self.options.topic_pattern)

    def _ends(self, root: Root, topics: list[str] | None = None) -> Offsets:
        """Every partition's published end, for the topics the stream reads now."""
        topics = self._topics(root) if topics is None else topics
        ids = {topic: root.config(topic).topic_id for topic in topics}  # before the logs' states
        items = ((t, p, root.log(t, p).state().log_end_offset) for t in topics for p in range(root.config(t).partitions))
        return _offsets(ids, items)


def _offsets(ids: Mapping[str, str], items: Iterable[tuple[str, int, int]]) -> Offsets:
    """Offsets by topic, each with its topic's id first (where it has one)."""
    out: Offsets = {topic: {ID: topic_id} if topic_id else {} for topic, topic_id in ids.items()}
    for topic, partition, offset in items:
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _numbered(partitions: Mapping[str, int | str]) -> list[tuple[str, int]]:
    """A topic's partitions and their offsets, without its id."""
    return [(p, _number(offset)) for p, offset in partitions.items() if p != ID]


def _number(offset: int | str) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidConfig(f"the checkpoint's offset {offset!r} is not a byte offset (is the checkpoint damaged?)")
    return offset


def _id(partitions: Mapping[str, object]) -> str:
    """A topic's id in a stream offset ("" for none: written by a kl before topic ids)."""
    value = partitions.get(ID)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidConfig(f"the checkpoint's topic id {value!r} is not a topic id (is the checkpoint damaged?)")
    return value


def _start(root: Root, topic: str, p: str, begin: int, end: int, fail_on_data_loss: bool) -> int:
    """Where a partition's next batch starts: ``begin`` (its offset in the batch's start,
    0 for a new partition), moved up (to at most ``end``) when retention deleted bytes
    there, or ``DataLoss``.  An offset past the log end is an error."""
    state = root.log(topic, int(p)).state()
    if begin > state.log_end_offset:
        raise InvalidConfig(
            f"{topic}/{p}: the stream's offset {begin} is past the log end {state.log_end_offset}"
            " (was the topic deleted and created again? start a new checkpoint)"
        )
    first = state.log_start_offset
    if begin < first and begin < end:
        if fail_on_data_loss:
            raise DataLoss(topic, int(p), begin, min(first, end))
        return min(first, end)
    return begin


def _share(cap: int, r: Range, total: int) -> int:
    """A partition's part of a cap: in proportion to its lag, at least 1 (0: no cap)."""
    return max(1, cap * r.size // total) if cap else 0
