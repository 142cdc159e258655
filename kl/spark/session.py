"""A Spark session set up for kl: the embedded ``local[*]`` by default, UTC, the source registered."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import IO

from pyspark.sql import SparkSession

from kl.errors import KlError

DEFAULT_MASTER = "local[*]"


class JavaNotFound(KlError):
    """Spark cannot start: no Java runtime."""


def session(
    master: str | None = None, *, app_name: str = "kl", conf: Mapping[str, str] | None = None, quiet: bool = False
) -> SparkSession:
    """The active session, or a new one on ``master`` (default: ``local[*]``, or what
    ``spark-submit`` chose).  Python workers run this interpreter unless
    ``PYSPARK_PYTHON`` says otherwise; timestamps are UTC; a local master binds to
    127.0.0.1 unless ``SPARK_LOCAL_IP`` says otherwise.  The ``kl`` source is
    registered (by pyspark itself where it finds ``pyspark_kl``, see
    ``found_by_pyspark``).  With ``quiet``, a new session's JVM logs errors only, from
    its start on (``quiet_conf``), and its start-up notice of Java's incubator modules
    is dropped from its standard error.  Raises ``JavaNotFound``."""
    active = SparkSession.getActiveSession()
    if active is None:
        java_home = os.environ.get("JAVA_HOME")
        if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and shutil.which("java") is None:
            raise JavaNotFound(
                "Spark needs a Java runtime (17 or newer) and none was found: install one "
                "(Debian: apt install openjdk-17-jre-headless) or set JAVA_HOME"
            )
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        options = {"spark.app.name": app_name, "spark.sql.session.timeZone": "UTC"}
        launched = "PYSPARK_GATEWAY_PORT" in os.environ  # under spark-submit, its --master rules
        if master or not launched:
            master = master or DEFAULT_MASTER
            options["spark.master"] = master
            if master.startswith("local"):
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # all in this process: stay on loopback
        options.update(conf or {})
        if quiet:
            for key, value in quiet_conf().items():
                options[key] = f"{options[key]} {value}" if key in options else value
        if quiet and not launched and _no_jvm_yet():
            _start_quiet(options)
        builder = SparkSession.builder
        for key, value in options.items():
            builder = builder.config(key, value)
        active = builder.getOrCreate()
    if not found_by_pyspark():  # else pyspark registers it (and warns of a second one)
        from kl.spark import register

        register(active)
    return active


QUIET_LOG4J2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")
"""kl's log4j2 settings for a quiet session: errors only, on standard error."""
_JVM_NOTICE = b"WARNING: Using incubator modules"
"""What the JVM prints at its start for the modules Spark adds (no log4j setting hides it)."""


def quiet_conf() -> dict[str, str]:
    """The settings that make a new session's log4j2 log errors only, from the JVM's start
    (Spark's start-up warnings and notices included): kl's configuration file, given
    to the driver's JVM, which runs a local master's executors too."""
    return {"spark.driver.extraJavaOptions": f'"-Dlog4j2.configurationFile={QUIET_LOG4J2}"'}


def _no_jvm_yet() -> bool:
    """Whether this process has started no Java gateway yet (pyspark keeps the first one,
    for every later SparkContext, even when its context was stopped)."""
    from pyspark import SparkContext

    return SparkContext._gateway is None and SparkContext._active_spark_context is None


def _start_quiet(options: Mapping[str, str]) -> None:
    """Start the JVM and the SparkContext with ``options``, the JVM's standard error
    passed on to ours but for its start-up notice (``_JVM_NOTICE``)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf().setAll(list(options.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_pass_on, args=(gateway.proc.stderr,), name="kl-spark-stderr", daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _pass_on(stream: IO[bytes]) -> None:
    """Copy the JVM's standard error to ours, line by line, without its start-up notice."""
    for line in iter(stream.readline, b""):
        if not line.startswith(_JVM_NOTICE):
            sys.stderr.write(line.decode(errors="replace"))
            sys.stderr.flush()


def found_by_pyspark() -> bool:
    """Whether pyspark registers the ``kl`` source by itself: it looks only at the modules
    on ``sys.path`` (``pkgutil.iter_modules``), so not at ``pyspark_kl`` when an import
    hook provides it, as pip's default (lenient) editable install does."""
    return any(module.name == "pyspark_kl" for module in pkgutil.iter_modules())
