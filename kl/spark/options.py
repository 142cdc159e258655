"""The ``kl`` Spark source's options (kl-spark(7)), checked: Spark passes every value as
a string, and a misspelt name is an error naming the closest known one."""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kl.errors import InvalidConfig
from kl.spark import arrow, ranges
from kl.spark.ranges import Range
from kl.topic import Root


@dataclass(frozen=True)
class Options:
    """The source's options, checked (Spark passes every value as a string)."""

    root: str
    topics: str | None
    topic_pattern: str | None
    starting: ranges.Offsets
    ending: ranges.Offsets
    starting_timestamp: int | None
    ending_timestamp: int | None
    fail_on_data_loss: bool
    skip_corrupt: bool
    min_partitions: int
    max_bytes_per_partition: int
    ranges: list[Range] | None
    max_offsets_per_trigger: int
    max_bytes_per_trigger: int
    columns: tuple[str, ...] | None = None
    """The columns to give (a schema set with ``.schema(...)``); None: all."""
    bad_timestamps: str = "fail"
    """What a timestamp outside the years 1 to 9999 does (``arrow.BAD_TIMESTAMPS``)."""
    on_recreated: str = "fail"
    """A stream whose topic was deleted and created again: ``fail``, or ``restart`` at its start."""
    include_headers: bool = False
    """Give the ``headers`` column too (``includeHeaders``, as Spark's Kafka source)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        known = {key.lower() for key in KNOWN_OPTIONS}
        unknown = sorted(key for key in options if key.lower() not in known and key.lower() != "path")
        if unknown:
            near = difflib.get_close_matches(unknown[0], [key.lower() for key in KNOWN_OPTIONS], n=1)
            hint = f" (did you mean {KNOWN_OPTIONS[[key.lower() for key in KNOWN_OPTIONS].index(near[0])]}?)" if near else ""
            raise InvalidConfig(f"unknown option {unknown[0]!r} of the kl source{hint}; it knows {', '.join(KNOWN_OPTIONS)}")
        get = {key.lower(): value for key, value in options.items()}.get
        root = get("root") or get("path")
        if not root:
            raise InvalidConfig('the kl source needs option("root", DIR): the directory holding the topics')
        now = time.time()  # one now for every relative time ("-1h" to "now" is an hour)
        return cls(
            root=root,
            topics=get("topics"),
            topic_pattern=get("topicpattern"),
            starting=ranges.parse_offsets(get("startingoffsets"), "startingOffsets", "earliest"),
            ending=ranges.parse_offsets(get("endingoffsets"), "endingOffsets", "latest"),
            starting_timestamp=ranges.parse_timestamp(get("startingtimestamp"), "startingTimestamp", now),
            ending_timestamp=ranges.parse_timestamp(get("endingtimestamp"), "endingTimestamp", now),
            fail_on_data_loss=flag(get("failondataloss"), "failOnDataLoss", True),
            skip_corrupt=flag(get("skipcorrupt"), "skipCorrupt", False),
            min_partitions=_count(get("minpartitions"), "minPartitions"),
            max_bytes_per_partition=_count(get("maxbytesperpartition"), "maxBytesPerPartition"),
            ranges=_ranges(get("ranges")),
            max_offsets_per_trigger=_count(get("maxoffsetspertrigger"), "maxOffsetsPerTrigger"),
            max_bytes_per_trigger=_count(get("maxbytespertrigger"), "maxBytesPerTrigger"),
            bad_timestamps=_bad_timestamps(get("badtimestamps")),
            on_recreated=_on_recreated(get("onrecreated")),
            include_headers=flag(get("includeheaders"), "includeHeaders", False),
        )

    def plan(self) -> list[Range]:
        """The batch read's tasks: the given ``ranges``, or planned now and split."""
        if self.ranges is not None:
            return self.ranges
        root = Root(self.root)
        topics = ranges.select_topics(root, self.topics, self.topic_pattern)
        planned = ranges.plan(
            root,
            topics,
            starting=self.starting,
            ending=self.ending,
            starting_timestamp=self.starting_timestamp,
            ending_timestamp=self.ending_timestamp,
            fail_on_data_loss=self.fail_on_data_loss,
        )
        return ranges.split(root, planned, min_partitions=self.min_partitions, max_bytes=self.max_bytes_per_partition)


KNOWN_OPTIONS = (
    "root",
    "topics",
    "topicPattern",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "failOnDataLoss",
    "skipCorrupt",
    "minPartitions",
    "maxBytesPerPartition",
    "ranges",
    "maxOffsetsPerTrigger",
    "maxBytesPerTrigger",
    "badTimestamps",
    "onRecreated",
    "includeHeaders",
)


def _bad_timestamps(text: str | None) -> str:
    if text is None:
        return "fail"
    if text.lower() not in arrow.BAD_TIMESTAMPS:
        raise InvalidConfig(f"option badTimestamps must be one of {', '.join(arrow.BAD_TIMESTAMPS)}, not {text!r}")
    return text.lower()


def flag(text: str | None, option: str, default: bool) -> bool:
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise InvalidConfig(f"{option} must be true or false, not {text!r}")


def _on_recreated(text: str | None) -> str:
    value = (text or "fail").strip().lower()
    if value not in ranges.ON_RECREATED:
        raise InvalidConfig(f"onRecreated must be fail or restart, not {text!r}")
    return value


def _count(text: str | None, option: str) -> int:
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidConfig(f"{option} must be a whole number >= 0, not {text!r}")
    return value


def _ranges(text: str | None) -> list[Range] | None:
    """The ``ranges`` option: JSON ``[[topic, partition, start, end], ...]``, read as given."""
    if text is None:
        return None
    try:
        return [Range(str(t), int(p), int(s), int(e)) for t, p, s, e in json.loads(text)]
    except (ValueError, TypeError) as e:
        raise InvalidConfig(f"ranges must be JSON [[topic, partition, start, end], ...]: {e}") from None


def option(options: Mapping[str, str], name: str) -> str | None:
    """An option's value, its name in any case (as Spark's options are)."""
    return {key.lower(): value for key, value in options.items()}.get(name.lower())
