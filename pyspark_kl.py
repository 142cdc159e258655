"""Lets pyspark find the ``kl`` data source by itself: it imports every installed
``pyspark_*`` module and registers its ``DefaultSource`` (``kl.spark.register`` does the
same explicitly)."""

from kl.spark.source import KlDataSource as DefaultSource

__all__ = ["DefaultSource"]
