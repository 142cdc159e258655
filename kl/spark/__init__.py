"""kl for Spark: the ``kl`` data source (batch and streaming) and the load into Parquet.

    import kl.spark
    kl.spark.register(spark)
    df = spark.read.format("kl").option("root", "/data/kl").option("topics", "events").load()

Needs ``pip install 'kl[spark]'`` (pyspark 4.0 or newer, pyarrow).  Importing this
package does not import pyspark; ``register`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("kl")`` and ``spark.readStream.format("kl")`` available."""
    from kl.spark.source import KlDataSource

    spark.dataSource.register(KlDataSource)
