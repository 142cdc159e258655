"""The run journal of ``kl load``: what an output directory holds, and how a run gets
there exactly once (no Spark here: ``kl load --status`` and ``--dry-run`` use only this).

An output directory ``DIR`` holds Parquet files under Hive-style directories, and the
journal under ``DIR/_kl/``::

    DIR/topic=T/date=YYYY-MM-DD/hour=HH/p<partition>-<start>-<end>-<tag>.parquet
    DIR/_kl/lock                     the run lock (kl.log.locks): one run at a time
    DIR/_kl/offsets.json             committed: per partition the offset reached, the topic id, rows, last run
    DIR/_kl/runs/<run>.json          a plan not yet committed: each task's byte range
    DIR/_kl/runs/<run>/<task>.done   a task's files are in place (names, row count)

A run, under the lock: finish an unfinished plan (its tasks without a done marker, with
the same ranges, so the same file names), commit it (``offsets.json`` replaced
atomically, then the plan removed), then plan from the committed offsets to the log ends
fixed now, write the plan durably, run its tasks, commit.  A task writes each file under
a hidden temporary name in the final directory (not ending in ``.parquet``), fsyncs it,
renames it into place and fsyncs the directory; a file's name is a function of its
task's range and its date/hour bucket, so a task run again replaces its files with the
same rows.  Whatever point a run is killed at, the next run ends with every message of
the committed ranges in exactly one file, and a reader of ``DIR/**/*.parquet`` never
sees a partial file or two copies of one.

Offsets name the topic id they were reached in: a topic deleted and created again since
fails the run (``TopicRecreated``), or with ``on_recreated="restart"`` is loaded from
the new topic's start.  A file name's ``<tag>`` is the first ``TAG_CHARS`` characters of
the topic id, so that the files of two creations never share a name (names written by a
kl before topic ids have no tag).  Offsets without an id count as the current creation's.

``KL_LOAD_KILL_AT=<point>`` makes the process SIGKILL itself at that point (``fault``),
and ``KL_LOAD_SLOW_TASK=<task>:<seconds>`` makes the first attempt of a task wait with
its files written and not yet renamed (``kl.spark.load``): fault-injection hooks for
tests, documented in kl-load(1).

Each run records how long its stages took (``RunReport.stages``, seconds): ``plan``
(the ranges fixed and the plan written), ``start`` (Spark started), ``job`` (the Spark
job, on the driver's clock), ``read`` and ``write`` (summed over the tasks, on theirs)
and ``commit`` (the offsets committed, the plan and temporary files removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from kl.errors import InvalidConfig, InvalidOffset, KlError, LockTimeout, TopicRecreated
from kl.log import locks
from kl.log.config import same_creation
from kl.log.fsutil import ensure_dir, fsync_dir, storage_error, write_atomic
from kl.log.log import EARLIEST, LATEST
from kl.spark import ranges
from kl.spark.ranges import DataLoss, Range
from kl.topic import Root

META = "_kl"
"""The journal's directory in DIR (a leading underscore: Parquet readers skip it)."""
OFFSETS = "offsets.json"
RUNS = "runs"
LOCK = "lock"
DONE_SUFFIX = ".done"
TMP_SUFFIX = ".tmp"
NULL_BUCKET = "__HIVE_DEFAULT_PARTITION__"
"""The date (and hour) directory of messages without a timestamp (Kafka 0.7 formats)."""
TASK_BYTES = 128 << 20
"""A partition's range is cut at segment starts into tasks of whole segments up to this
size (a bigger segment is one task): planning reads no segment, so its cost does not
grow with the messages."""
WAIT_FOREVER = 30 * 86400.0
"""``wait=True`` waits this long for the run lock."""
KILL_ENV = "KL_LOAD_KILL_AT"
SLOW_ENV = "KL_LOAD_SLOW_TASK"
POINTS = ("written", "commit", "committed")
"""The named points of ``fault``: every task done, nothing committed; the new offsets
written to a temporary file, not yet renamed; committed, the plan not yet removed."""
GRANULARITIES = ("hour", "day")
VALUE_FORMATS = ("binary", "text", "json")
STARTS = ("earliest", "latest")
ON_DATA_LOSS = ("fail", "skip")
RECREATED_REMEDY = "load into another directory, or run with --on-recreated restart to load the new topic from its start"
TAG_CHARS = 8
RESERVED = ("key", "value", "topic", "partition", "offset", "nextOffset", "timestamp", "date", "hour")
"""Columns of a loaded file and of its directories: a JSON schema field may not reuse them."""
FORMAT_VERSION = 1

T = TypeVar("T")


class LoadRunning(KlError):
    """Another ``kl load`` holds the run lock of the output directory."""


class LoadDataLoss(KlError):
    """Offsets a load needs were deleted by retention before they were loaded."""

    def __init__(self, loss: DataLoss):
        super().__init__(
            f"data loss: topic {loss.topic!r} partition {loss.partition} offsets {loss.start} to {loss.end}"
            " were deleted by retention before they were loaded (--on-data-loss skip loads what is left)"
        )
        self.loss = loss


class JournalError(KlError):
    """A journal file of the output directory cannot be read."""


def fault(point: str) -> None:
    """SIGKILL this process if ``KL_LOAD_KILL_AT`` names ``point`` (tests only)."""
    if os.environ.get(KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Settings:
    """What a run writes, recorded in its plan (a plan is finished with its own settings)."""

    granularity: str = "hour"
    value_format: str = "binary"
    schema: str | None = None
    headers: bool = False
    """Write each message's headers as a column ``headers`` (``kl load --headers``)."""

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise InvalidConfig(f"granularity must be one of {', '.join(GRANULARITIES)}, not {self.granularity!r}")
        if self.value_format not in VALUE_FORMATS:
            raise InvalidConfig(f"value format must be one of {', '.join(VALUE_FORMATS)}, not {self.value_format!r}")
        if (self.value_format == "json") != (self.schema is not None):
            raise InvalidConfig("the json value format needs a schema (a DDL string), and only it takes one")

    def describe(self) -> str:
        schema = "" if self.schema is None else f" --schema {self.schema!r}"
        headers = " --headers" if self.headers else ""
        return f"--granularity {self.granularity} --value-format {self.value_format}{schema}{headers}"


@dataclass(frozen=True)
class Limits:
    """How a new run is planned: where new topics start, data loss, caps per partition."""

    start: str = "earliest"
    on_data_loss: str = "fail"
    max_bytes: int = 0
    max_messages: int = 0
    on_recreated: str = "fail"

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            raise InvalidConfig(f"start must be earliest or latest, not {self.start!r}")
        if self.on_data_loss not in ON_DATA_LOSS:
            raise InvalidConfig(f"on data loss must be fail or skip, not {self.on_data_loss!r}")
        if self.on_recreated not in ranges.ON_RECREATED:
            raise InvalidConfig(f"on recreated must be fail or restart, not {self.on_recreated!r}")
        if self.max_bytes < 0 or self.max_messages < 0:
            raise InvalidConfig("max bytes and max messages must be >= 0")


@dataclass
class Plan:
    """One run: its tasks' byte ranges (an empty range records where a partition stands)."""

    run: str
    created: str
    tasks: list[Range]
    settings: Settings
    lost: list[Range] = field(default_factory=list)
    """Ranges deleted by retention before they were loaded (``on_data_loss="skip"``)."""
    topic_ids: dict[str, str] = field(default_factory=dict)
    """The id of each topic the tasks read (none in a plan of a kl before topic ids)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "run": self.run,
            "created": self.created,
            **asdict(self.settings),
            "tasks": [r._asdict() for r in self.tasks],
            "lost": [r._asdict() for r in self.lost],
            "topic_ids": self.topic_ids,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Plan:
        return cls(
            run=obj["run"],
            created=obj["created"],
            tasks=[Range(**t) for t in obj["tasks"]],
            settings=Settings(obj["granularity"], obj["value_format"], obj["schema"], obj.get("headers", False)),
            lost=[Range(**t) for t in obj.get("lost", [])],
            topic_ids={str(topic): _topic_id(i) for topic, i in obj.get("topic_ids", {}).items()},
        )

    def file_name(self, r: Range) -> str:
        """The name of a task's file in each of its buckets: ``p<partition>-<start>-<end>-<tag>.parquet``."""
        tag = self.topic_ids.get(r.topic, "")[:TAG_CHARS]
        return f"p{r.partition}-{r.start}-{r.end}{'-' + tag if tag else ''}.parquet"

    def ends(self) -> dict[tuple[str, int], int]:
        """Per partition the offset the plan reaches."""
        out: dict[tuple[str, int], int] = {}
        for r in self.tasks:
            out[(r.topic, r.partition)] = max(out.get((r.topic, r.partition), r.end), r.end)
        return out


@dataclass
class Done:
    """A task's done marker: its files (relative to DIR), rows, and seconds spent
    reading and writing (``{"read": s, "write": s}``; none in a marker of an older kl)."""

    task: int
    range: Range
    files: list[str]
    rows: int
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "range": self.range._asdict(), "files": self.files, "rows": self.rows, "seconds": self.seconds}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Done:
        seconds = {str(k): float(v) for k, v in obj.get("seconds", {}).items()}
        return cls(obj["task"], Range(**obj["range"]), obj["files"], obj["rows"], seconds)


@dataclass
class Committed:
    """A partition's line in ``offsets.json``."""

    topic: str
    partition: int
    offset: int
    rows: int
    run: str
    loaded_at: str
    topic_id: str = ""
    """The id of the topic the offset is of ("" when committed by a kl before topic ids)."""

    @classmethod
    def from_json(cls, topic: str, partition: str, line: dict[str, Any]) -> Committed:
        """A line of ``offsets.json``; ``ValueError`` for one that is not."""
        offset, rows = line["offset"], line["rows"]
        for name, value in (("offset", offset), ("rows", rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{topic}/{partition}'s {name} {value!r} is not a number >= 0")
        if not isinstance(line["run"], str) or not isinstance(line["loaded_at"], str):
            raise ValueError(f"{topic}/{partition}'s run and loaded_at must be strings")
        return cls(topic, int(partition), offset, rows, line["run"], line["loaded_at"], _topic_id(line.get("topic_id", "")))


def _topic_id(value: object) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"topic id {value!r} is not a topic id")
    return value


def bucket_dir(topic: str, bucket: str) -> str:
    """The directory (relative to DIR) of a topic's bucket, ``date=D/hour=H`` or ``date=D``."""
    return f"topic={topic}/{bucket}"


def is_tmp_of(name: str, run: str) -> bool:
    """Whether ``name`` is a temporary data file of ``run`` (see ``tmp_name``)."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX) and f".{run}." in name


def tmp_name(final: str, run: str) -> str:
    """A hidden temporary name for ``final`` in the same directory; globs of ``*.parquet`` miss it."""
    return f".{final}.{run}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"


class Journal:
    """The journal of one output directory.  Safe across processes under ``lock``."""

    def __init__(self, output: str | os.PathLike[str]):
        self.output = os.path.abspath(os.fspath(output))
        self.meta = os.path.join(self.output, META)
        self.runs = os.path.join(self.meta, RUNS)

    # -------------------------------------------------------------- the lock

    @contextlib.contextmanager
    def locked(self, *, wait: bool = False) -> Iterator[None]:
        """Hold the run lock.  Raises ``LoadRunning`` when another run holds it (after
        ``WAIT_FOREVER`` with ``wait``)."""
        ensure_dir(self.meta)
        try:
            lock = locks.lock_for(os.path.join(self.meta, LOCK))
            lock.acquire(WAIT_FOREVER if wait else 0)
        except LockTimeout:
            raise LoadRunning(f"another kl load is running on {self.output} (--wait waits for it)") from None
        try:
            yield
        finally:
            lock.release()

    # -------------------------------------------------------------- committed offsets

    def committed(self) -> tuple[str | None, dict[tuple[str, int], Committed]]:
        """The last committed run and, per partition, what is committed."""

        def parse(obj: dict[str, Any]) -> tuple[str | None, dict[tuple[str, int], Committed]]:
            out = {}
            for topic, partitions in obj["topics"].items():
                for p, line in partitions.items():
                    out[(topic, int(p))] = Committed.from_json(topic, p, line)
            return obj["run"], out

        return self._read(os.path.join(self.meta, OFFSETS), parse) or (None, {})

    def settings(self) -> Settings | None:
        """The settings the committed files were written with (None before the first commit)."""
        return self._read(os.path.join(self.meta, OFFSETS), lambda obj: Settings(**obj["settings"]))

    def check_settings(self, settings: Settings, unfinished: Plan | None) -> None:
        """Raise ``InvalidConfig`` unless ``settings`` are those DIR's files were written with:
        readers of one directory need one layout and one set of columns."""
        stored = self.settings() or (unfinished.settings if unfinished else None)
        if stored is not None and stored != settings:
            raise InvalidConfig(
                f"{self.output} holds files written with {stored.describe()}; this run asks for {settings.describe()}"
                " (load into another directory to change them)"
            )

    def commit(self, plan: Plan) -> dict[tuple[str, int], int]:
        """Record the plan's ends as committed (once: a plan already committed is left
        alone) and remove the plan.  Returns the rows the plan loaded per partition."""
        loaded: dict[tuple[str, int], int] = {(r.topic, r.partition): 0 for r in plan.tasks}
        for done in self.done(plan).values():
            loaded[(done.range.topic, done.range.partition)] += done.rows
        last, committed = self.committed()
        if last != plan.run:
            at = now_iso()
            ends = plan.ends()
            for key in [k for k, c in committed.items() if k not in ends and k[0] in plan.topic_ids]:
                if not same_creation(committed[key].topic_id, plan.topic_ids[key[0]]):
                    del committed[key]  # a partition the topic lost when it was created again
            for key, end in ends.items():
                before = committed.get(key)
                rows = (before.rows if before else 0) + loaded[key]
                topic_id = plan.topic_ids.get(key[0]) or (before.topic_id if before else "")
                committed[key] = Committed(key[0], key[1], end, rows, plan.run, at, topic_id)
            topics: dict[str, dict[str, Any]] = {}
            for (topic, p), c in sorted(committed.items()):
                topics.setdefault(topic, {})[str(p)] = {k: v for k, v in asdict(c).items() if k not in ("topic", "partition")}
            data = {
                "version": FORMAT_VERSION,
                "run": plan.run,
                "committed_at": at,
                "settings": asdict(plan.settings),
                "topics": topics,
            }
            write_atomic(
                os.path.join(self.meta, OFFSETS),
                (json.dumps(data, indent=2) + "\n").encode(),
                before_rename=lambda: fault("commit"),
            )
            fault("committed")
        self.remove_plan(plan)
        return loaded

    # -------------------------------------------------------------- plans and done markers

    def unfinished(self) -> Plan | None:
        """The plan of a run that was not committed (at most one: runs hold the lock)."""
        names = sorted(n for n in self._listdir(self.runs) if n.endswith(".json") and not n.startswith("."))
        if len(names) > 1:
            raise JournalError(f"{self.runs} holds {len(names)} plans ({', '.join(names)}); a run leaves at most one")
        if not names:
            return None
        return self._read(os.path.join(self.runs, names[0]), Plan.from_json)

    def write_plan(self, plan: Plan) -> None:
        """Write the plan durably (before any task runs)."""
        ensure_dir(self.runs)
        write_atomic(os.path.join(self.runs, f"{plan.run}.json"), (json.dumps(plan.to_json(), indent=1) + "\n").encode())
        ensure_dir(self.task_dir(plan.run))

    def task_dir(self, run: str) -> str:
        return os.path.join(self.runs, run)

    def done(self, plan: Plan) -> dict[int, Done]:
        """The plan's tasks that are done, by index."""
        out = {}
        directory = self.task_dir(plan.run)
        for name in self._listdir(directory):
            if name.endswith(DONE_SUFFIX) and not name.startswith("."):
                done = self._read(os.path.join(directory, name), Done.from_json)
                if done is None:  # removed meanwhile
                    continue
                if not 0 <= done.task < len(plan.tasks) or done.range != plan.tasks[done.task]:
                    raise JournalError(f"{directory}/{name} names range {done.range}, not the plan's {plan.tasks[done.task]}")
                out[done.task] = done
        return out

    def remove_plan(self, plan: Plan) -> None:
        """Remove a committed plan: the plan first (the run is then finished), then its markers."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.runs, f"{plan.run}.json"))
            fsync_dir(self.runs)
        self.remove_strays()

    def remove_strays(self) -> None:
        """Marker directories of runs without a plan (left by a run killed while removing
        its plan), and temporary files of the journal."""
        names = self._listdir(self.runs)
        plans = {n[: -len(".json")] for n in names if n.endswith(".json") and not n.startswith(".")}
        for name in names:
            path = os.path.join(self.runs, name)
            if name.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            elif name not in plans and os.path.isdir(path):
                for entry in self._listdir(path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, entry))
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(path)
        for name in self._listdir(self.meta):
            if name.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.meta, name))

    def remove_tmp(self, run: str, directories: list[str] | None = None) -> int:
        """Remove the run's temporary data files left by killed tasks: in ``directories``
        (relative to DIR), or anywhere in DIR.  Returns how many went."""
        if directories is None:
            walk = [(top, names) for top, _, names in os.walk(self.output) if not top.startswith(self.meta)]
        else:
            walk = [(os.path.join(self.output, d), self._listdir(os.path.join(self.output, d))) for d in directories]
        removed = 0
        for top, names in walk:
            for name in names:
                if is_tmp_of(name, run):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(top, name))
                        removed += 1
        return removed

    # -------------------------------------------------------------- helpers

    @staticmethod
    def _listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise storage_error(e, "list", path) from None

    @staticmethod
    def _read(path: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
        """``parse`` of the JSON object in ``path``; None when there is no such file."""
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read())
        except FileNotFoundError:
            return None
        except OSError as e:
            raise storage_error(e, "read", path) from None
        except ValueError as e:
            raise JournalError(f"{path} is not valid JSON: {e}") from None
        try:
            return parse(obj)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise JournalError(f"{path} is not a kl load journal file ({type(e).__name__}: {e})") from None


def write_done(journal_dir: str, done: Done) -> None:
    """Write a task's done marker (by the task, after its files are in place)."""
    write_atomic(os.path.join(journal_dir, f"{done.task:05d}{DONE_SUFFIX}"), json.dumps(done.to_json()).encode())


# ----------------------------------------------------------------- planning


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def plan_run(
    root: Root,
    topics: list[str],
    committed: dict[tuple[str, int], int],
    limits: Limits,
    settings: Settings,
    *,
    task_bytes: int = TASK_BYTES,
    topic_ids: dict[tuple[str, int], str] | None = None,
) -> Plan:
    """A new run from the ``committed`` offsets (new topics at ``limits.start``, partitions
    added to a topic loaded before at their start) to
    the log ends fixed now, capped per partition.  ``topic_ids`` are the ids the offsets
    were committed with: offsets of another creation of a topic raise ``TopicRecreated``,
    or with ``on_recreated="restart"`` are dropped and the topic is loaded from its
    start.  Raises ``LoadDataLoss`` (or records the loss with ``on_data_loss="skip"``),
    ``TopicNotFound``, and ``JournalError`` for an offset that is not in the log."""
    names = ranges.select_topics(root, topics, None)
    recorded = topic_ids or {}
    ids: dict[str, str] = {}
    starting: dict[str, dict[int, int]] = {}
    for topic in names:
        ids[topic] = current = root.config(topic).topic_id  # before the logs' states
        count = root.config(topic).partitions
        stale = [(t, p) for t, p in committed if t == topic and not same_creation(recorded.get((t, p)), current)]
        if stale and limits.on_recreated != "restart":
            raise TopicRecreated(topic, recorded[stale[0]], current, "load journal", RECREATED_REMEDY)
        starting[topic] = {}
        loaded = any(t == topic for t, _ in committed)
        for p in range(count):
            if stale:
                offset = 0  # the new topic's start: what retention deleted since is a data loss
            elif (topic, p) not in committed:  # in a topic loaded before, added since (kl topics alter): all of it
                offset = LATEST if limits.start == "latest" and not loaded else EARLIEST
            else:
                offset = committed[(topic, p)]
                _check_committed(root, topic, p, offset)
            starting[topic][p] = offset
    lost: list[Range] = []
    try:
        planned = ranges.plan(
            root,
            names,
            starting=starting,
            ending="latest",
            fail_on_data_loss=limits.on_data_loss == "fail",
            on_loss=lambda loss: lost.append(Range(loss.topic, loss.partition, loss.start, loss.end)),
        )
    except DataLoss as e:
        raise LoadDataLoss(e) from None
    except InvalidOffset as e:  # only a committed offset can be off a message boundary
        raise JournalError(f"the load journal's offset is not a message's start: {e} (is the journal damaged?)") from None
    capped = [ranges.cap(root, r, max_bytes=limits.max_bytes, max_messages=limits.max_messages) if r.size else r for r in planned]
    tasks = ranges.split_at_segments(root, capped, task_bytes)
    return Plan(new_run_id(), now_iso(), tasks, settings, lost, {t: i for t, i in ids.items() if i})


def _check_committed(root: Root, topic: str, partition: int, offset: int) -> None:
    """A committed offset of the topic's current creation is in its log: else ``JournalError``."""
    end = root.log(topic, partition).state().log_end_offset
    if offset > end:
        raise JournalError(
            f"{topic}/{partition} is loaded up to offset {offset}, past its log end {end}:"
            " the load journal does not match the topic (is it damaged?)"
        )


def _without_recreated(root: Root, plan: Plan, todo: list[int], limits: Limits) -> list[int]:
    """The tasks ``todo`` but those of topics deleted and created again since the plan
    was made: their ranges are gone, recorded in ``plan.lost``.  Raises
    ``TopicRecreated`` for such a topic unless ``on_recreated="restart"``."""
    gone = set()
    for topic in sorted({plan.tasks[i].topic for i in todo}):
        planned, current = plan.topic_ids.get(topic, ""), root.topic_id(topic)
        if not same_creation(planned, current):
            if limits.on_recreated != "restart":
                raise TopicRecreated(topic, planned, current, "load journal", RECREATED_REMEDY)
            gone.add(topic)
    plan.lost.extend(plan.tasks[i] for i in todo if plan.tasks[i].topic in gone)
    return [i for i in todo if plan.tasks[i].topic not in gone]


def losses(root: Root, tasks: list[Range]) -> list[Range]:
    """The parts of ``tasks`` retention deleted since they were planned."""
    out = []
    for r in tasks:
        start = root.log(r.topic, r.partition).state().log_start_offset
        if r.size and r.start < start:
            out.append(r._replace(end=min(start, r.end)))
    return out


# ----------------------------------------------------------------- status


@dataclass
class Status:
    """What an output directory holds (``kl load --status``)."""

    output: str
    last_run: str | None
    partitions: list[Committed]
    unfinished: str | None
    unfinished_tasks: int = 0
    unfinished_done: int = 0


def status(output: str | os.PathLike[str]) -> Status:
    """What is loaded into ``output``; reads the journal only (no lock, no Spark)."""
    journal = Journal(output)
    if not os.path.isdir(journal.output):
        raise KlError(f"{journal.output} does not exist")
    if not os.path.isdir(journal.meta):
        raise KlError(f"{journal.output} holds no kl load output (no {META}/ directory)")
    last, committed = journal.committed()
    plan = journal.unfinished()
    result = Status(journal.output, last, sorted(committed.values(), key=lambda c: (c.topic, c.partition)), None)
    if plan is not None:
        result.unfinished = plan.run
        result.unfinished_tasks = sum(1 for r in plan.tasks if r.size)
        result.unfinished_done = len(journal.done(plan))
    return result


# ----------------------------------------------------------------- a run


@dataclass
class PartitionReport:
    """What a run did (or, in a dry run, would do) to one partition."""

    topic: str
    partition: int
    start: int
    end: int
    bytes: int
    messages: int | None
    """Rows written (None in a dry run: not counted)."""
    lag: int
    """Bytes between ``end`` and the log end now."""
    lost: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class RunReport:
    run: str
    resumed: bool
    """The run finished a plan left unfinished by an earlier run."""
    dry_run: bool
    partitions: list[PartitionReport]
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage of the run: plan, start, job, read, write, commit (see the module docstring)."""


PHASES = ("planned", "writing", "written", "committed")


@dataclass(frozen=True)
class LoadProgress:
    """Where a run stands, for a ``progress`` callback: ``planned`` (before Spark writes),
    ``writing`` (again and again while it writes), ``written`` (every task done) and
    ``committed`` (the run's offsets committed).  The tasks and bytes are those this call
    writes (of an unfinished run, those not done yet); messages are counted as they
    are written (a plan knows byte offsets, not messages)."""

    phase: str
    run: str
    partitions: int
    tasks: int
    bytes: int
    tasks_done: int = 0
    bytes_done: int = 0
    messages_written: int = 0
    messages_committed: int = 0


Progress = Callable[[LoadProgress], None]


def progress_of(phase: str, plan: Plan, todo: list[int], done: dict[int, Done], committed: int = 0) -> LoadProgress:
    """The ``LoadProgress`` of the tasks ``todo`` of ``plan``, ``done`` being its done markers."""
    written = [i for i in todo if i in done]
    return LoadProgress(
        phase,
        plan.run,
        len({(plan.tasks[i].topic, plan.tasks[i].partition) for i in todo}),
        len(todo),
        sum(plan.tasks[i].size for i in todo),
        len(written),
        sum(plan.tasks[i].size for i in written),
        sum(done[i].rows for i in written),
        committed,
    )


Execute = Callable[[Journal, Plan, list[int], bool], Mapping[str, float] | None]
"""Runs the plan's tasks of the given indexes (``fail_on_data_loss`` last); each task
writes its files and its done marker (``kl.spark.load``).  May return the seconds Spark
took to start (``{"start": s}``), which the run's ``job`` stage leaves out."""


def run(
    root: Root,
    output: str | os.PathLike[str],
    topics: list[str],
    limits: Limits,
    settings: Settings,
    *,
    execute: Execute | None,
    dry_run: bool = False,
    wait: bool = False,
    task_bytes: int = TASK_BYTES,
    progress: Progress | None = None,
) -> list[RunReport]:
    """One ``kl load`` run (see the module docstring): an unfinished plan is finished and
    committed, then a new one is planned, run and committed.  With ``dry_run`` nothing is
    written, locked or run: the reports say what would be.  ``progress`` is called with
    each phase of each plan run (``LoadProgress``; ``writing`` comes from ``execute``).  Raises ``LoadRunning``,
    ``LoadDataLoss``, ``TopicNotFound`` and the errors of ``execute``."""
    journal = Journal(output)
    if dry_run:
        return _preview(root, journal, topics, limits, settings, task_bytes)
    if execute is None:
        raise ValueError("a run needs an execute function")
    reports = []
    with journal.locked(wait=wait):
        journal.remove_strays()
        plan = journal.unfinished()
        journal.check_settings(settings, plan)
        if plan is not None:
            reports.append(_finish(root, journal, plan, limits, execute, progress, resumed=True))
        began = time.perf_counter()
        _, committed = journal.committed()
        offsets, ids = {k: c.offset for k, c in committed.items()}, {k: c.topic_id for k, c in committed.items()}
        plan = plan_run(root, topics, offsets, limits, settings, task_bytes=task_bytes, topic_ids=ids)
        if any(r.size for r in plan.tasks) or any((r.topic, r.partition) not in committed for r in plan.tasks):
            journal.write_plan(plan)
            planned = time.perf_counter() - began
            reports.append(_finish(root, journal, plan, limits, execute, progress, resumed=False, planned=planned))
        else:
            reports.append(_report(root, plan, {}, resumed=False, dry_run=False))
            reports[-1].stages["plan"] = time.perf_counter() - began
    return reports


def _finish(
    root: Root,
    journal: Journal,
    plan: Plan,
    limits: Limits,
    execute: Execute,
    progress: Progress | None,
    *,
    resumed: bool,
    planned: float = 0.0,
) -> RunReport:
    """Run the plan's tasks that are not done, then commit it.  ``planned``: the
    seconds its planning took (none for a plan finished)."""
    report = progress or (lambda _: None)
    stages = {"plan": planned, "start": 0.0, "job": 0.0}
    done = journal.done(plan)
    todo = _without_recreated(root, plan, [i for i, r in enumerate(plan.tasks) if r.size and i not in done], limits)
    lost = losses(root, [plan.tasks[i] for i in todo])
    if lost and limits.on_data_loss == "fail":
        r = lost[0]
        raise LoadDataLoss(DataLoss(r.topic, r.partition, r.start, r.end))
    plan.lost.extend(lost)
    report(progress_of("planned", plan, todo, {}))
    if todo:
        began = time.perf_counter()
        stages.update(execute(journal, plan, todo, limits.on_data_loss == "fail") or {})
        stages["job"] = time.perf_counter() - began - stages["start"]
        done = journal.done(plan)
        missing = [i for i in todo if i not in done]
        if missing:
            raise JournalError(f"run {plan.run}: tasks {missing} ended without their done markers")
    report(progress_of("written", plan, todo, done))
    fault("written")
    began = time.perf_counter()
    directories = sorted({os.path.dirname(f) for d in done.values() for f in d.files})
    rows = journal.commit(plan)
    journal.remove_tmp(plan.run, None if resumed else directories)
    stages["commit"] = time.perf_counter() - began
    for stage in ("read", "write"):
        stages[stage] = sum(done[i].seconds.get(stage, 0.0) for i in todo if i in done)
    report(progress_of("committed", plan, todo, done, sum(rows.values())))
    result = _report(root, plan, rows, resumed=resumed, dry_run=False)
    result.stages = stages
    return result


def _preview(
    root: Root, journal: Journal, topics: list[str], limits: Limits, settings: Settings, task_bytes: int
) -> list[RunReport]:
    """What a run would do, changing nothing."""
    reports = []
    _, committed = journal.committed()
    offsets, ids = {k: c.offset for k, c in committed.items()}, {k: c.topic_id for k, c in committed.items()}
    plan = journal.unfinished()
    journal.check_settings(settings, plan)
    if plan is not None:
        done = journal.done(plan)
        todo = _without_recreated(root, plan, [i for i, r in enumerate(plan.tasks) if r.size and i not in done], limits)
        plan.lost.extend(losses(root, [plan.tasks[i] for i in todo]))
        reports.append(_report(root, plan, {}, resumed=True, dry_run=True))
        offsets.update(plan.ends())
        ids.update({key: plan.topic_ids.get(key[0], "") for key in plan.ends()})
    plan = plan_run(root, topics, offsets, limits, settings, task_bytes=task_bytes, topic_ids=ids)
    reports.append(_report(root, plan, {}, resumed=False, dry_run=True))
    return reports


def _report(root: Root, plan: Plan, rows: dict[tuple[str, int], int], *, resumed: bool, dry_run: bool) -> RunReport:
    partitions: dict[tuple[str, int], PartitionReport] = {}
    for r in plan.tasks:
        key = (r.topic, r.partition)
        p = partitions.get(key)
        if p is None:
            p = partitions[key] = PartitionReport(
                r.topic, r.partition, r.start, r.end, 0, None if dry_run else rows.get(key, 0), 0
            )
        p.start, p.end, p.bytes = min(p.start, r.start), max(p.end, r.end), p.bytes + r.size
    for r in plan.lost:
        partitions[(r.topic, r.partition)].lost.append((r.start, r.end))
    for (topic, partition), report in partitions.items():
        report.lag = max(0, root.log(topic, partition).state().log_end_offset - report.end)
    return RunReport(plan.run, resumed, dry_run, list(partitions.values()))
