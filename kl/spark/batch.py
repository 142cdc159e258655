"""The ``kl`` Spark source's batch read: the driver plans byte ranges, each a Spark task
(``KlPartition``), and executors read them as Arrow record batches."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from kl.errors import InvalidConfig
from kl.spark import arrow
from kl.spark.options import Options
from kl.spark.ranges import Range
from kl.topic import Root


class KlPartition(InputPartition):
    """One Spark task: a byte range of a partition."""

    def __init__(self, r: Range):
        super().__init__(tuple(r))
        self.range = r


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
