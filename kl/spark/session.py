"""A Spark session set up for kl: the embedded ``local[*]`` by default, UTC, the source registered."""

from __future__ import annotations

import os
import pkgutil
import shutil
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from kl.errors import KlError

DEFAULT_MASTER = "local[*]"


class JavaNotFound(KlError):
    """Spark cannot start: no Java runtime."""


def session(master: str | None = None, *, app_name: str = "kl", conf: Mapping[str, str] | None = None) -> SparkSession:
    """The active session, or a new one on ``master`` (default: ``local[*]``, or what
    ``spark-submit`` chose).  Python workers run this interpreter unless
    ``PYSPARK_PYTHON`` says otherwise; timestamps are UTC; a local master binds to
    127.0.0.1 unless ``SPARK_LOCAL_IP`` says otherwise.  The ``kl`` source is
    registered (by pyspark itself where it finds ``pyspark_kl``, see
    ``found_by_pyspark``).  Raises ``JavaNotFound``."""
    active = SparkSession.getActiveSession()
    if active is None:
        java_home = os.environ.get("JAVA_HOME")
        if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and shutil.which("java") is None:
            raise JavaNotFound(
                "Spark needs a Java runtime (17 or newer) and none was found: install one "
                "(Debian: apt install openjdk-17-jre-headless) or set JAVA_HOME"
            )
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
        if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # under spark-submit, its --master rules
            master = master or DEFAULT_MASTER
            builder = builder.master(master)
            if master.startswith("local"):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # all in this process: stay on loopback
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        active = builder.getOrCreate()
    if not found_by_pyspark():  # else pyspark registers it (and warns of a second one)
        from kl.spark import register

        register(active)
    return active


def found_by_pyspark() -> bool:
    """Whether pyspark registers the ``kl`` source by itself: it looks only at the modules
    on ``sys.path`` (``pkgutil.iter_modules``), so not at ``pyspark_kl`` when an import
    hook provides it, as pip's default (lenient) editable install does."""
    return any(module.name == "pyspark_kl" for module in pkgutil.iter_modules())
