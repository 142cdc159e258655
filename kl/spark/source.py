"""The ``kl`` data source for Spark (PySpark's Python Data Source API, pyspark 4.0+).

    spark.read.format("kl").option("root", R).option("topics", "a,b").load()

The driver plans byte ranges (``kl.spark.ranges``), each a Spark task; executors read
them with ``kl.spark.arrow`` and hand Spark Arrow record batches.  Executors need the
same root at the same path, and kl installed.  The options are listed in kl-spark(7).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from kl.errors import InvalidConfig
from kl.spark import arrow, ranges
from kl.spark.ranges import Range
from kl.topic import Root

NAME = "kl"


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
            fail_on_data_loss=_flag(get("failondataloss"), "failOnDataLoss", True),
            skip_corrupt=_flag(get("skipcorrupt"), "skipCorrupt", False),
            min_partitions=_count(get("minpartitions"), "minPartitions"),
            max_bytes_per_partition=_count(get("maxbytesperpartition"), "maxBytesPerPartition"),
            ranges=_ranges(get("ranges")),
            max_offsets_per_trigger=_count(get("maxoffsetspertrigger"), "maxOffsetsPerTrigger"),
            max_bytes_per_trigger=_count(get("maxbytespertrigger"), "maxBytesPerTrigger"),
            bad_timestamps=_bad_timestamps(get("badtimestamps")),
            on_recreated=_on_recreated(get("onrecreated")),
            include_headers=_flag(get("includeheaders"), "includeHeaders", False),
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


def _flag(text: str | None, option: str, default: bool) -> bool:
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


class KlPartition(InputPartition):
    """One Spark task: a byte range of a partition."""

    def __init__(self, r: Range):
        super().__init__(tuple(r))
        self.range = r


class KlDataSource(DataSource):
    """``spark.read.format("kl")`` and ``spark.readStream.format("kl")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return arrow.DDL_HEADERS if _flag(_option(self.options, "includeHeaders"), "includeHeaders", False) else arrow.DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        options = Options.parse(self.options)
        return KlReader(dataclasses.replace(options, columns=columns_of(schema, options.include_headers)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from kl.spark.stream import KlStreamReader, stream_options

        options = stream_options(self.options)
        return KlStreamReader(dataclasses.replace(options, columns=columns_of(schema, options.include_headers)))


def _option(options: Mapping[str, str], name: str) -> str | None:
    """An option's value, its name in any case (as Spark's options are)."""
    return {key.lower(): value for key, value in options.items()}.get(name.lower())


def columns_of(schema: StructType, headers: bool = False) -> tuple[str, ...] | None:
    """The columns a schema given with ``.schema(...)`` picks (None: all of them, in
    order; ``headers``: the ``headers`` column too).  Fewer columns are less for Spark
    to take in."""
    full = arrow.SCHEMA_HEADERS if headers else arrow.SCHEMA
    names = tuple(schema.fieldNames())
    if names == tuple(full.names):
        return None
    types = {field.name: field.type for field in full}
    for field in schema.fields:
        if field.name not in types or _spark_type(types[field.name]) != field.dataType.simpleString():
            raise InvalidConfig(
                f"the kl source has no column {field.name} {field.dataType.simpleString()}; "
                f"a schema may pick some of: {arrow.DDL_HEADERS if headers else arrow.DDL}"
            )
    return names


def _spark_type(arrow_type: pa.DataType) -> str:
    if arrow_type == arrow.HEADERS_TYPE:
        return "array<struct<key:string,value:binary>>"
    return {"int32": "int", "int64": "bigint"}.get(
        str(arrow_type), "timestamp" if pa.types.is_timestamp(arrow_type) else str(arrow_type)
    )


class KlReader(DataSourceReader):
    """The batch read: planned once, on the driver, when Spark asks for the partitions."""

    def __init__(self, options: Options):
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [KlPartition(r) for r in self.options.plan() if r.size]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


def read_partition(options: Options, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """An executor's part: the task's range as record batches.  (Spark reads a plan
    with no ranges as one task given ``InputPartition(None)``.)"""
    if not isinstance(partition, KlPartition):
        return iter(())
    batches = arrow.read_range(
        Root(options.root),
        partition.range,
        skip_corrupt=options.skip_corrupt,
        fail_on_data_loss=options.fail_on_data_loss,
        bad_timestamps=options.bad_timestamps,
        headers=options.include_headers,
    )
    if options.columns is None:
        return batches
    columns = list(options.columns)
    return (batch.select(columns) for batch in batches)
