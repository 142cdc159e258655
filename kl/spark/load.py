"""``kl load``: topics into Parquet, exactly once, on Spark.

The run protocol and the output directory's journal are ``kl.spark.journal``'s; this
module is the Spark job that runs a plan's tasks, one Spark task each (``mapInArrow``):
the task reads its byte range with ``kl.spark.arrow`` (or, for JSON values, Spark reads
it with the ``kl`` source, option ``ranges``, and parses the values with ``from_json``),
writes its files with pyarrow (Arrow in, Parquet out, no Python per row), renames them
into place and writes its done marker.

    from kl.spark.load import load
    load(kl.Root("/data/kl"), "/data/lake/events", ["events"])
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import SparkContext, TaskContext
from pyspark.errors import PySparkException, PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kl.errors import InvalidConfig, KlError
from kl.log.fsutil import ensure_dir, fsync_dir
from kl.spark import arrow
from kl.spark import journal as j
from kl.spark.journal import Done, Journal, Limits, Plan, Progress, RunReport, Settings
from kl.spark.ranges import DataLoss, Range
from kl.topic import Root

log = logging.getLogger(__name__)

COMPRESSION = "zstd"
ROW_GROUP_BYTES = 64 << 20
"""Rows of a bucket are gathered up to about this many bytes per Parquet row group."""
HOUR_US = 3600 * 1_000_000
DAY_US = 24 * HOUR_US
_NULL_KEY = np.iinfo(np.int64).min


def load(
    root: Root,
    output: str | os.PathLike[str],
    topics: list[str],
    *,
    limits: Limits | None = None,
    settings: Settings | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    wait: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
    bad_timestamps: str = "fail",
    quiet: bool = True,
) -> list[RunReport]:
    """Load ``topics`` into ``output`` (see ``kl.spark.journal.run``).  Spark is started
    (``kl.spark.session.session(master)``) only when there is something to write or a
    JSON schema to check, and stopped at the end if this call started it.  Raises ``KlError`` subclasses: the
    error of a Spark task comes back as the kl error it raised.  ``bad_timestamps`` says
    what a timestamp outside the years 1 to 9999 does: "fail" (``InvalidTimestamp``
    naming the message), "clamp" (to the nearer end of the range) or "null".
    ``progress`` is called with each phase of each run (``kl.spark.journal.LoadProgress``:
    planned, writing about twice a second while Spark writes, written, committed),
    from this thread but for ``writing``, which comes from another one.  A Spark started
    here is ``quiet`` (``kl.spark.session.session``) unless told otherwise."""
    limits = limits or Limits()
    settings = settings or Settings()
    runner = SparkRunner(root, spark, master, progress, arrow.check_bad_timestamps(bad_timestamps), quiet=quiet)
    try:
        if settings.value_format == "json" and not dry_run:
            check_schema(runner.session(), settings.schema or "", settings.headers)
        return j.run(root, output, topics, limits, settings, execute=runner, dry_run=dry_run, wait=wait, progress=progress)
    finally:
        runner.close()


def check_schema(spark: SparkSession, ddl: str, headers: bool = False) -> list[str]:
    """The field names of a DDL schema; raises ``InvalidConfig`` for a bad one or a
    field named like a column kl writes (``headers`` too, with ``headers``)."""
    try:
        fields = spark.createDataFrame([], ddl).schema.names
    except PySparkException as e:
        raise InvalidConfig(f"schema {ddl!r} is not a DDL schema such as 'user string, n int': {_first_line(e)}") from None
    reserved = {name.lower(): name for name in (*j.RESERVED, *(["headers"] if headers else []))}
    for name in fields:
        if name.lower() in reserved:
            raise InvalidConfig(
                f"schema field {name!r} collides with kl's column {reserved[name.lower()]!r}"
                f" (kl writes {', '.join(j.RESERVED)}): rename it in the schema"
            )
    return fields


class SparkRunner:
    """Runs a plan's tasks as one Spark job (the ``execute`` of ``journal.run``)."""

    def __init__(
        self,
        root: Root,
        spark: SparkSession | None,
        master: str | None,
        progress: Progress | None,
        bad_timestamps: str = "fail",
        *,
        quiet: bool = True,
    ):
        self.root = root
        self.quiet = quiet
        self.bad_timestamps = bad_timestamps
        self.spark = spark
        self.master = master
        self.progress = progress
        self.started = False

    def session(self) -> SparkSession:
        if self.spark is None:
            from kl.spark.session import session

            self.started = SparkSession.getActiveSession() is None
            conf = {"spark.ui.showConsoleProgress": "false"}
            self.spark = session(self.master, app_name="kl load", conf=conf, quiet=self.quiet)
            if self.started and self.quiet:  # under spark-submit, its JVM started before kl's settings
                self.spark.sparkContext.setLogLevel("ERROR")
        return self.spark

    def close(self) -> None:
        if self.started and self.spark is not None:
            self.spark.stop()

    def __call__(self, journal: Journal, plan: Plan, todo: list[int], fail_on_data_loss: bool) -> dict[str, float]:
        """Run the tasks; returns the seconds Spark took to start (0 when it ran)."""
        began = time.perf_counter()
        spark = self.session()
        started = time.perf_counter() - began
        tasks = [plan.tasks[i] for i in todo]
        names = [plan.file_name(r) for r in tasks]
        writer = TaskWriter(
            journal.output,
            journal.task_dir(plan.run),
            plan.run,
            todo,
            tasks,
            names,
            plan.settings,
            self.root.path,
            fail_on_data_loss,
            self.bad_timestamps,
        )
        if plan.settings.value_format == "json":  # Spark parses: read with the kl source, one Spark partition per task
            df = with_json_columns(
                spark.read.format("kl")
                .option("root", os.path.abspath(self.root.path))
                .option("ranges", json.dumps([list(r) for r in tasks]))
                .option("failOnDataLoss", str(fail_on_data_loss).lower())
                .option("badTimestamps", self.bad_timestamps)
                .option("includeHeaders", str(plan.settings.headers).lower())
                .load(),
                plan.settings.schema or "",
            )
        else:  # each task reads its range itself: no trip through Spark's rows
            df = spark.range(0, len(tasks), 1, len(tasks))
        stop = threading.Event()
        watcher = None
        if self.progress is not None:
            watcher = threading.Thread(target=self._watch, args=(journal, plan, todo, stop), daemon=True)
            watcher.start()
        context = spark.sparkContext
        group, outer = f"kl-load-{plan.run}", {key: context.getLocalProperty(key) for key in JOB_PROPERTIES}
        context.setJobGroup(group, f"kl load, run {plan.run}")
        try:
            df.mapInArrow(writer, "task int, rows long").collect()
            _wait_for_attempts(context, group)
        except PySparkException as e:
            raise unwrap(e) from None
        finally:
            for key, value in outer.items():  # the caller's own (None clears one)
                context.setLocalProperty(key, value)  # type: ignore[arg-type]
            stop.set()
            if watcher is not None:
                watcher.join()
        return {"start": started}

    def _watch(self, journal: Journal, plan: Plan, todo: list[int], stop: threading.Event) -> None:
        """Report the tasks' done markers as ``writing`` progress until ``stop`` is set."""
        assert self.progress is not None
        while True:
            self.progress(j.progress_of("writing", plan, todo, journal.done(plan)))
            if stop.wait(0.5):
                return


JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
"""The local properties ``setJobGroup`` sets."""
ATTEMPTS_TIMEOUT = 120.0
"""How long a run waits for the attempts Spark killed to end (see ``_wait_for_attempts``)."""


def _wait_for_attempts(context: SparkContext, group: str, timeout: float = ATTEMPTS_TIMEOUT) -> None:
    """Until no attempt of the job group's tasks still runs.  A speculative copy that
    Spark killed once another attempt succeeded goes on writing its files until its
    Python worker is gone, which may be after the job ended; the commit that follows
    removes the run's temporary files, and one written after it would stay."""
    tracker = context.statusTracker()
    stages = [s for job in tracker.getJobIdsForGroup(group) if (info := tracker.getJobInfo(job)) for s in info.stageIds]
    deadline = time.monotonic() + timeout
    while any((stage := tracker.getStageInfo(s)) is not None and stage.numActiveTasks for s in stages):
        if time.monotonic() >= deadline:
            log.warning("killed Spark task attempts still run after %gs; their temporary files may stay", timeout)
            return
        time.sleep(0.1)


def with_json_columns(df: DataFrame, schema: str) -> DataFrame:
    """The source's columns with ``value`` as text, then the columns parsed from it."""
    text = F.col("value").cast("string")
    columns = [text.alias("value") if c == "value" else F.col(c) for c in df.columns]
    return df.select(*columns, F.from_json(text, schema).alias("_kl_parsed")).select(*df.columns, "_kl_parsed.*")


_KL_ERROR = re.compile(r"^(kl(?:\.\w+)*)\.(\w+): (.+)$", re.MULTILINE)
_LOSS = re.compile(r"topic '(.+)' partition (\d+) offsets (\d+) to (\d+)")


def unwrap(error: PySparkException) -> KlError:
    """The kl error a Spark task raised, from the long exception Spark wraps it in."""
    text = str(error)
    found = _KL_ERROR.findall(text)
    if not found:  # a Python error ends the worker's traceback; a JVM error starts its message
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(error).__name__]
        return KlError(f"the Spark job failed: {lines[-1] if isinstance(error, PythonException) else lines[0]}")
    _, name, message = found[-1]
    if name == "DataLoss" and (loss := _LOSS.search(message)):
        topic, partition, start, end = loss.groups()
        return j.LoadDataLoss(DataLoss(topic, int(partition), int(start), int(end)))
    return KlError(message)


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


class TaskWriter:
    """One Spark task: its rows into a Parquet file per date/hour bucket, each written
    under a hidden temporary name, fsynced and renamed into place; then the done marker.
    Spark partition ``i`` is the plan's task ``todo[i]`` (the source keeps the order).
    The rows are Spark's (JSON values, parsed by Spark), or else read here with
    ``kl.spark.arrow`` (Spark then only hands out the tasks): Spark's trip from Arrow to
    its rows and back costs more than reading and writing."""

    def __init__(
        self,
        output: str,
        journal_dir: str,
        run: str,
        todo: list[int],
        tasks: list[Range],
        names: list[str],
        settings: Settings,
        root: str,
        fail_on_data_loss: bool,
        bad_timestamps: str = "fail",
    ):
        self.output = output
        self.journal_dir = journal_dir
        self.run = run
        self.todo = todo
        self.tasks = tasks
        self.names = names
        self.unit = HOUR_US if settings.granularity == "hour" else DAY_US
        self.text = settings.value_format != "binary"
        self.read = settings.value_format != "json"
        self.headers = settings.headers
        self.root = os.path.abspath(root)
        self.fail_on_data_loss = fail_on_data_loss
        self.bad_timestamps = bad_timestamps

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        index = context.partitionId()
        r = self.tasks[index]
        began = time.perf_counter()
        if self.read:
            for _ in batches:  # the task's number, from spark.range
                pass
            batches = arrow.read_range(
                Root(self.root),
                r,
                fail_on_data_loss=self.fail_on_data_loss,
                bad_timestamps=self.bad_timestamps,
                headers=self.headers,
            )
        buckets: dict[int, _Bucket] = {}
        rows = 0
        reading = 0.0
        try:
            while True:
                at = time.perf_counter()
                batch = next(batches, None)
                reading += time.perf_counter() - at
                if batch is None:
                    break
                if not batch.num_rows:
                    continue
                self._check(batch, r)
                batch = self._columns(batch)
                rows += batch.num_rows
                for key, piece in self._split(batch):
                    bucket = buckets.get(key)
                    if bucket is None:
                        bucket = buckets[key] = _Bucket(self.output, self._directory(r.topic, key), self.names[index], self.run)
                    bucket.add(piece)
            for bucket in buckets.values():
                bucket.finish()
            _slow(self.todo[index], context.attemptNumber())
            files = [bucket.publish() for bucket in buckets.values()]
            for directory in sorted({os.path.dirname(f) for f in files}):
                fsync_dir(os.path.join(self.output, directory))
        except BaseException:
            for bucket in buckets.values():
                bucket.discard()
            raise
        seconds = {"read": reading, "write": time.perf_counter() - began - reading}
        j.write_done(self.journal_dir, Done(self.todo[index], r, sorted(files), rows, seconds))
        yield pa.RecordBatch.from_arrays(
            [pa.array([self.todo[index]], pa.int32()), pa.array([rows], pa.int64())], ["task", "rows"]
        )

    @staticmethod
    def _check(batch: pa.RecordBatch, r: Range) -> None:
        topic = batch.column("topic")[0].as_py()
        partition = batch.column("partition")[0].as_py()
        offset = batch.column("offset")[0].as_py()
        if (topic, partition) != (r.topic, r.partition) or not r.start <= offset < r.end:
            raise KlError(f"a Spark task got {topic}/{partition} offset {offset}, outside its range {tuple(r)}")

    def _columns(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch without ``topic`` (it is in the path); text values as valid UTF-8."""
        names = [n for n in batch.schema.names if n != "topic"]
        arrays = [batch.column(n) for n in names]
        if self.text:
            i = names.index("value")
            arrays[i] = _as_text(arrays[i])
        return pa.RecordBatch.from_arrays(arrays, names)

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
        """The batch's rows by bucket (the hour or day of the timestamp, ``_NULL_KEY`` for none)."""
        stamps = batch.column("timestamp").cast(pa.int64())
        keys = np.floor_divide(stamps.fill_null(0).to_numpy(), self.unit)
        if stamps.null_count:
            keys[stamps.is_null().to_numpy(zero_copy_only=False)] = _NULL_KEY
        first = keys[0]
        if (keys == first).all():
            yield int(first), batch
            return
        for key in np.unique(keys):
            yield int(key), batch.filter(pa.array(keys == key))

    def _directory(self, topic: str, key: int) -> str:
        if key == _NULL_KEY:
            bucket = f"date={j.NULL_BUCKET}" + (f"/hour={j.NULL_BUCKET}" if self.unit == HOUR_US else "")
        else:
            at = datetime.fromtimestamp(key * self.unit / 1e6, timezone.utc)
            bucket = f"date={at:%Y-%m-%d}" + (f"/hour={at:%H}" if self.unit == HOUR_US else "")
        return j.bucket_dir(topic, bucket)


def _slow(task: int, attempt: int) -> None:
    """Wait as ``KL_LOAD_SLOW_TASK=<task>:<seconds>`` says, in the first attempt of that
    task, its files written and not yet renamed (a test's slow task, for speculation)."""
    spec = os.environ.get(j.SLOW_ENV, "")
    if spec and attempt == 0:
        slow, seconds = spec.split(":")
        if int(slow) == task:
            time.sleep(float(seconds))


def _as_text(values: pa.Array) -> pa.Array:
    """Values (binary, or Spark's unchecked strings) as valid UTF-8: bytes that are not become U+FFFD."""
    try:
        if pa.types.is_string(values.type):
            values.validate(full=True)
            return values
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        as_bytes = values.cast(pa.binary()).to_pylist()
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in as_bytes], pa.string())


class _Bucket:
    """A task's file in one bucket directory, written under a temporary name."""

    def __init__(self, output: str, directory: str, name: str, run: str):
        self.relative = os.path.join(directory, name)
        path = os.path.join(output, directory)
        ensure_dir(path)
        self.final = os.path.join(path, name)
        self.tmp = os.path.join(path, j.tmp_name(name, run))
        self.writer: pq.ParquetWriter | None = None
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_bytes += batch.nbytes
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        table = pa.Table.from_batches(self.pending)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, table.schema, compression=COMPRESSION)
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.pending, self.pending_bytes = [], 0

    def finish(self) -> None:
        """Write the rest of the file and fsync it, under its temporary name."""
        if self.pending:
            self._flush()
        assert self.writer is not None
        self.writer.close()
        fd = os.open(self.tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def publish(self) -> str:
        """Rename the finished file into place; returns its path in DIR."""
        os.rename(self.tmp, self.final)
        return self.relative

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)
