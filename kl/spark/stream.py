"""The ``kl`` streaming source: ``spark.readStream.format("kl")`` (pyspark 4.0+).

    spark.readStream.format("kl").option("root", R).option("topics", "a").load()

An offset is JSON ``{"topic": {"partition": next_offset}}``: for each partition the byte
offset the next micro-batch starts at.  A stream starts at ``startingOffsets``
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
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
import pyspark
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from kl.errors import InvalidConfig, KlError
from kl.spark import ranges
from kl.spark.ranges import DataLoss, Range
from kl.spark.source import KlPartition, Options, read_partition
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


Offsets = dict[str, dict[str, int]]
"""A stream offset: per topic, per partition (a string, as in JSON) the next byte offset."""

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
            planned = ranges.plan(
                root,
                self._topics(root),
                starting=self.options.starting,
                starting_timestamp=self.options.starting_timestamp,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
        return _offsets((r.topic, r.partition, r.start) for r in planned)

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
        by ``limit``.  Partitions of ``start`` no longer read keep their offsets.
        (pyspark before 4.2 passes neither ``start`` nor ``limit``.)"""
        with self._root() as root:
            ends = self.target if self.target is not None else self._ends(root)
            if start is None:
                return ends
            max_messages, max_bytes = self._caps(limit)
            out = {topic: dict(partitions) for topic, partitions in start.items()}
            lags = []
            for topic, partitions in ends.items():
                for p, end in partitions.items():
                    begin = _start(root, start, topic, p, end, self.options.fail_on_data_loss)
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
        since fail (``failOnDataLoss``) or are skipped, logged."""
        planned = []
        with self._root() as root:
            for topic, partitions in end.items():
                for p, stop in partitions.items():
                    begin = start.get(topic, {}).get(p, 0)
                    if begin >= stop:
                        continue
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

    def _ends(self, root: Root) -> Offsets:
        """Every partition's published end, for the topics the stream reads now."""
        return _offsets(
            (topic, p, root.log(topic, p).state().log_end_offset)
            for topic in self._topics(root)
            for p in range(root.config(topic).partitions)
        )


def _offsets(items: Iterable[tuple[str, int, int]]) -> Offsets:
    out: Offsets = {}
    for topic, partition, offset in items:
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _start(root: Root, start: Offsets, topic: str, p: str, end: int, fail_on_data_loss: bool) -> int:
    """Where a partition's next batch starts: its offset in ``start`` (0 for a new
    partition), moved up (to at most ``end``) when retention deleted bytes there, or
    ``DataLoss``.  An offset past the log end means the partition was replaced: an error."""
    begin = start.get(topic, {}).get(p, 0)
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
