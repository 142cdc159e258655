"""The ``kl`` data source for Spark (PySpark's Python Data Source API, pyspark 4.0+).

    spark.read.format("kl").option("root", R).option("topics", "a,b").load()

The driver plans byte ranges (``kl.spark.ranges``), each a Spark task; executors read
them with ``kl.spark.arrow`` and hand Spark Arrow record batches.  Executors need the
same root at the same path, and kl installed.  The options are listed in kl-spark(7).
"""

from __future__ import annotations

import dataclasses

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from kl.spark import arrow
from kl.spark.batch import KlReader, columns_of
from kl.spark.options import Options, flag, option
from kl.spark.stream import KlStreamReader, stream_options

NAME = "kl"


class KlDataSource(DataSource):
    """``spark.read.format("kl")`` and ``spark.readStream.format("kl")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return arrow.DDL_HEADERS if flag(option(self.options, "includeHeaders"), "includeHeaders", False) else arrow.DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        options = Options.parse(self.options)
        return KlReader(dataclasses.replace(options, columns=columns_of(schema, options.include_headers)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = stream_options(self.options)
        return KlStreamReader(dataclasses.replace(options, columns=columns_of(schema, options.include_headers)))
