"""``kl load``: topics into Parquet exactly once, checked with pyarrow's dataset and
DuckDB against what ``kl.Consumer`` reads, across runs, caps, data loss, a second run,
and real SIGKILLs at each crash point (then a re-run)."""

from __future__ import annotations

import collections
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from lakecheck import assert_consistent, assert_loaded, committed, expected
from pyspark.errors import PythonException

import kl
from kl.errors import TopicRecreated
from kl.log.messageset import frame
from kl.log.recovery import recover
from kl.log.retention import retain
from kl.log.validate import Checked
from kl.spark import journal
from kl.spark.journal import Limits, LoadDataLoss, LoadRunning, Settings
from kl.spark.load import SparkRunner, load, unwrap
from kl_cli.main import cli

from conftest import KAFKA07_SEGMENT, flip_byte, partition_dir, write

pytestmark = pytest.mark.spark

HOUR_MS = 3600 * 1000
TS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
KL = [sys.executable, "-m", "kl_cli"]
ROLLING = kl.TopicConfig(segment_bytes=1024, max_message_bytes=512)
"""32 messages of 32 bytes (10-byte values) to a segment."""
COLUMNS = ["key", "value", "partition", "offset", "nextOffset", "timestamp"]


# ----------------------------------------------------------------- helpers


def produce(root: kl.Root, topic: str, count: int, *, partition: int = 0, ts: int = TS, tag: str = "m") -> None:
    write(root, topic, [b"%s%09d" % (tag.encode(), i) for i in range(count)], partition=partition, timestamp=ts)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def kl_load(root: kl.Root, *args: str, kill_at: str | None = None, **popen) -> subprocess.Popen:
    """``kl load`` as a real process (its own session, so the whole process tree can be killed)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop(journal.KILL_ENV, None)
    if kill_at:
        env[journal.KILL_ENV] = kill_at
    return subprocess.Popen(
        [*KL, "--root", str(root.path), "load", *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def cli_run(root: kl.Root, *args: str):
    return CliRunner().invoke(cli, ["--root", str(root.path), "load", *args], env={"KL_ROOT": None})


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "lake"


# ----------------------------------------------------------------- loading


def test_every_message_is_loaded_once_in_hive_directories_by_hour(spark, root, out):
    root.create_topic("a", kl.TopicConfig(partitions=2))
    root.create_topic("b")
    produce(root, "a", 50, partition=0)
    produce(root, "a", 30, partition=0, ts=TS + HOUR_MS, tag="n")
    produce(root, "a", 20, partition=1)
    write(root, "b", [b"v1", b"v2"], keys=[b"k1", None], timestamp=TS)
    reports = load(root, out, ["a", "b"], spark=spark)

    assert_loaded(out, expected(root, ["a", "b"]))
    end0 = root.log("a", 0).state().log_end_offset
    end1 = root.log("a", 1).state().log_end_offset
    end_b = root.log("b", 0).state().log_end_offset
    a, b = root.topic_id("a")[:8], root.topic_id("b")[:8]  # the tag: two creations of a topic never share a name
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet")) == [
        f"topic=a/date=2023-11-14/hour=22/p0-0-{end0}-{a}.parquet",
        f"topic=a/date=2023-11-14/hour=22/p1-0-{end1}-{a}.parquet",
        f"topic=a/date=2023-11-14/hour=23/p0-0-{end0}-{a}.parquet",
        f"topic=b/date=2023-11-14/hour=22/p0-0-{end_b}-{b}.parquet",
    ]
    [report] = reports
    assert [(p.topic, p.partition, p.start, p.end, p.messages, p.lag) for p in report.partitions] == [
        ("a", 0, 0, end0, 80, 0),
        ("a", 1, 0, end1, 20, 0),
        ("b", 0, 0, end_b, 2, 0),
    ]
    # Every stage recorded (read and write summed over the tasks, which may run at once).
    assert sorted(report.stages) == ["commit", "job", "plan", "read", "start", "write"]
    assert all(seconds >= 0 for seconds in report.stages.values())
    assert report.stages["job"] > 0 and report.stages["read"] + report.stages["write"] > 0
    assert committed(out) == {("a", 0): end0, ("a", 1): end1, ("b", 0): end_b}
    assert not list((out / "_kl" / "runs").iterdir())

    some = next(out.rglob("p0-*.parquet"))
    meta = pq.ParquetFile(some).metadata
    assert meta.schema.names == COLUMNS
    assert meta.row_group(0).column(0).compression == "ZSTD"
    # All three readers give back the source's columns, topic from the path.
    columns = {"topic", *COLUMNS}
    assert columns <= set(ds.dataset(out, format="parquet", partitioning="hive").schema.names)
    assert columns <= {
        d[0]
        for d in duckdb.connect()
        .execute(f"describe select * from read_parquet('{out}/**/*.parquet', hive_partitioning=true)")
        .fetchall()
    }
    df = spark.read.parquet(str(out))
    assert columns <= set(df.columns)
    rows = df.where("topic = 'b'").orderBy("offset").select("key", "value", "timestamp").collect()
    assert [(r.key, r.value) for r in rows] == [(b"k1", b"v1"), (None, b"v2")]
    assert rows[0].timestamp.timestamp() == TS / 1000


def test_day_granularity_and_messages_without_a_timestamp(spark, root, out):
    root.create_topic("legacy")
    directory = partition_dir(root, "legacy")
    for name in os.listdir(directory):
        os.unlink(directory / name)
    shutil.copy(KAFKA07_SEGMENT, directory)  # Kafka 0.7 messages: no timestamp
    recover(root.log("legacy", 0))
    root.forget("legacy")
    produce(root, "legacy", 5)
    load(root, out, ["legacy"], settings=Settings(granularity="day"), spark=spark)
    assert sorted(p.parent.name for p in out.rglob("*.parquet")) == ["date=2023-11-14", "date=__HIVE_DEFAULT_PARTITION__"]
    assert_loaded(out, expected(root, ["legacy"]))
    query = f"select count(*) from read_parquet('{out}/**/*.parquet', hive_partitioning=true) where date is null"
    assert duckdb.connect().execute(query + " and timestamp is null").fetchone() == (100,)


def test_runs_load_what_is_new_and_nothing_twice(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 40, partition=0)
    load(root, out, ["t"], spark=spark)
    before = tree(out)
    [report] = load(root, out, ["t"], spark=spark)
    assert [p.messages for p in report.partitions] == [0, 0]
    assert list(report.stages) == ["plan"]  # nothing to run
    assert {k: v for k, v in tree(out).items() if not k.startswith("_kl")} == {
        k: v for k, v in before.items() if not k.startswith("_kl")
    }
    with pytest.raises(kl.InvalidConfig) as e:
        load(root, out, ["t"], settings=Settings(granularity="day"), spark=spark)
    assert str(e.value) == (
        f"{out} holds files written with --granularity hour --value-format binary; this run asks for"
        " --granularity day --value-format binary (load into another directory to change them)"
    )
    produce(root, "t", 10, partition=0, tag="x")
    produce(root, "t", 7, partition=1, tag="y")
    [report] = load(root, out, ["t"], spark=spark)
    assert [p.messages for p in report.partitions] == [10, 7]
    assert_loaded(out, expected(root, ["t"]))
    assert {(c.topic, c.partition): c.rows for c in journal.status(out).partitions} == {("t", 0): 50, ("t", 1): 7}


def test_a_load_runs_its_tasks_in_a_job_group_of_its_own_and_gives_the_callers_back(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 40, partition=0)
    context = spark.sparkContext
    context.setJobGroup("mine", "the caller's jobs")
    try:
        [report] = load(root, out, ["t"], spark=spark)
        tracker = context.statusTracker()
        assert report.partitions[0].messages == 40
        assert tracker.getJobIdsForGroup(f"kl-load-{report.run}") and not tracker.getJobIdsForGroup("mine")
        assert context.getLocalProperty("spark.jobGroup.id") == "mine"
        assert context.getLocalProperty("spark.job.description") == "the caller's jobs"
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)


def test_a_cap_drains_a_backlog_over_several_runs(spark, root, out):
    root.create_topic("t", ROLLING)
    produce(root, "t", 100)
    end = root.log("t", 0).state().log_end_offset
    limits = Limits(max_messages=30, max_bytes=2000)
    lags, messages = [], []
    for _ in range(4):
        [report] = load(root, out, ["t"], limits=limits, spark=spark)
        [p] = report.partitions
        lags.append(p.lag)
        messages.append(p.messages)
    assert messages == [30, 30, 30, 10]
    assert lags == [end - 30 * 32, end - 60 * 32, end - 90 * 32, 0]
    assert_loaded(out, expected(root, ["t"]))


def test_a_new_topic_starts_at_earliest_or_with_start_latest_at_its_end(spark, root, out):
    root.create_topic("old")
    root.create_topic("new")
    produce(root, "old", 5)
    produce(root, "new", 5)
    load(root, out, ["old", "new"], limits=Limits(start="latest"), spark=spark)
    assert_loaded(out, collections.Counter())
    assert committed(out) == {("old", 0): 5 * 32, ("new", 0): 5 * 32}
    produce(root, "new", 3, tag="x")
    root.create_topic("newer")
    produce(root, "newer", 2)
    load(root, out, ["old", "new", "newer"], spark=spark)
    want = expected(root, ["new"], upto={("new", 0): 8 * 32}) - expected(root, ["new"], upto={("new", 0): 5 * 32})
    assert_loaded(out, want + expected(root, ["newer"]))


def test_data_loss_fails_naming_the_range_or_with_skip_loads_what_is_left(spark, root, out):
    root.create_topic("t", ROLLING)
    produce(root, "t", 40)
    load(root, out, ["t"], limits=Limits(max_messages=10), spark=spark)
    produce(root, "t", 100, tag="x")
    first = expected(root, ["t"], upto={("t", 0): 320})
    retain(root.log("t", 0), max_bytes=2048, max_age_ms=0, delete_delay=0)
    start = root.log("t", 0).state().log_start_offset
    with pytest.raises(LoadDataLoss) as e:
        load(root, out, ["t"], spark=spark)
    assert str(e.value) == (
        f"data loss: topic 't' partition 0 offsets 320 to {start} were deleted by retention before they were loaded"
        " (--on-data-loss skip loads what is left)"
    )
    assert committed(out) == {("t", 0): 320} and journal.Journal(out).unfinished() is None
    [report] = load(root, out, ["t"], limits=Limits(on_data_loss="skip"), spark=spark)
    assert report.partitions[0].lost == [(320, start)]
    assert_loaded(out, expected(root, ["t"]) + first)  # retention deleted the first ten too: they are still in the lake


def test_a_second_run_exits_at_once_or_waits_with_wait(spark, root, out):
    root.create_topic("t")
    produce(root, "t", 3)
    (out / "_kl").mkdir(parents=True)
    code = f"import time, kl.log.locks\nwith kl.log.locks.locked({str(out / '_kl' / 'lock')!r}, 10):\n"
    code += "    print('held', flush=True)\n    time.sleep(2)\n"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(LoadRunning, match=f"^another kl load is running on {out} "):
            load(root, out, ["t"], spark=spark)
        result = cli_run(root, "t", "-o", str(out))
        assert result.exit_code == 1 and result.output.endswith(
            f"Error: another kl load is running on {out} (--wait waits for it)\n"
        )
        load(root, out, ["t"], wait=True, spark=spark)
        assert holder.poll() == 0  # it waited until the holder was gone
    finally:
        holder.kill()
        holder.wait()
    assert_loaded(out, expected(root, ["t"]))


def test_progress_reports_each_phase_of_a_run_in_order(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 60, partition=0)
    produce(root, "t", 40, partition=1)
    events: list[journal.LoadProgress] = []
    [report] = load(root, out, ["t"], spark=spark, progress=events.append)
    phases = [e.phase for i, e in enumerate(events) if i == 0 or e.phase != events[i - 1].phase]
    assert phases == ["planned", "writing", "written", "committed"]
    planned, written, done = events[0], events[-2], events[-1]
    size = sum(p.bytes for p in report.partitions)
    assert (planned.run, planned.partitions, planned.tasks, planned.bytes) == (report.run, 2, 2, size)
    assert (planned.tasks_done, planned.bytes_done, planned.messages_written, planned.messages_committed) == (0, 0, 0, 0)
    assert (written.tasks_done, written.bytes_done, written.messages_written, written.messages_committed) == (2, size, 100, 0)
    assert done == journal.LoadProgress("committed", report.run, 2, 2, size, 2, size, 100, 100)
    assert all(e.messages_written <= 100 for e in events)
    events.clear()
    load(root, out, ["t"], spark=spark, progress=events.append)  # nothing new: no run, no events
    assert events == []


def test_cli_verbose_lets_spark_log(root, out, monkeypatch):
    seen: list[bool] = []
    monkeypatch.setattr("kl.spark.load.load", lambda *args, quiet, **kwargs: seen.append(quiet) or [])
    assert cli_run(root, "t", "-o", str(out)).exit_code == 0
    assert cli_run(root, "t", "-o", str(out), "-v").exit_code == 0
    assert seen == [True, False]


def test_quiet_session_settings_name_kls_log4j2_file():
    from kl.spark.session import QUIET_LOG4J2, quiet_conf

    assert quiet_conf() == {"spark.driver.extraJavaOptions": f'"-Dlog4j2.configurationFile={QUIET_LOG4J2}"'}
    assert "rootLogger.level = error" in Path(QUIET_LOG4J2).read_text()


CHATTER = ("log4j", "WARN", "INFO", "Setting default log level", "setLogLevel", "incubator", "NativeCodeLoader")


def test_cli_without_a_terminal_prints_only_the_summary_and_no_spark_chatter(root, out):
    root.create_topic("t")
    produce(root, "t", 100)
    process = kl_load(root, "t", "-o", str(out))
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr.decode()
    lines = stderr.decode().splitlines()
    end = root.log("t", 0).log_end_offset
    assert lines[0].startswith("run ") and lines[0].endswith(f": loaded 100 messages ({end:,} bytes)")
    assert [line.split() for line in lines[1:]] == [
        ["partition", "messages", "bytes", "from", "->", "to", "lag", "lost"],
        ["t/0", "100", f"{end:,}", "0", "->", str(end), "0", "-"],
    ]


def test_cli_on_a_terminal_shows_the_progress_and_no_spark_chatter(root, out, spark_gateway):
    """(In the tests' shared Spark JVM: the JVM's own start, quiet or not, is the test above's.)"""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 70, partition=0)
    produce(root, "t", 30, partition=1)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, COLUMNS="160", **spark_gateway.env)
    env.pop("CI", None)
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [*KL, "--root", str(root.path), "load", "t", "-o", str(out)], env=env, stdin=secondary, stdout=secondary, stderr=secondary
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 1 << 16)
        except OSError:  # EIO: every end of the terminal is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert process.wait(60) == 0
    spark_gateway.stop_context()
    text = b"".join(chunks).decode(errors="replace")
    assert "2 partitions, 2/2 tasks, 100 messages" in text  # the display's last state, before it is cleared
    assert "committed" in text and "loaded 100 messages" in text
    assert not [word for word in CHATTER if word in text]


def test_dry_run_prints_the_plan_and_changes_nothing(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 10)
    result = cli_run(root, "t", "-o", str(out), "--dry-run", "--json", "--max-messages", "4")
    assert result.exit_code == 0, result.output
    assert not out.exists()
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["partition"], r["start"], r["end"], r["lag"], r["dry_run"], r["messages"]) for r in rows] == [
        (0, 0, 128, 192, True, None),
        (1, 0, 0, 0, True, None),
    ]
    load(root, out, ["t"], limits=Limits(max_messages=4), spark=spark)
    before = tree(out)
    result = cli_run(root, "t", "-o", str(out), "--dry-run")
    assert result.exit_code == 0
    assert "would load 192 bytes" in result.stderr
    assert tree(out) == before


def test_status_shows_what_is_loaded_without_spark(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 10, partition=1)
    [report] = load(root, out, ["t"], spark=spark)
    result = CliRunner().invoke(cli, ["load", "--status", str(out)])
    assert result.exit_code == 0
    at = journal.status(out).partitions[0].loaded_at
    assert result.stdout == (
        f"t/0: offset 0, 0 rows, last run {report.run} at {at}\nt/1: offset 320, 10 rows, last run {report.run} at {at}\n"
    )
    result = CliRunner().invoke(cli, ["load", "--status", str(out), "--json"])
    assert json.loads(result.stdout.splitlines()[1]) == {
        "topic": "t",
        "partition": 1,
        "offset": 320,
        "rows": 10,
        "run": report.run,
        "loaded_at": at,
        "topic_id": root.topic_id("t"),
    }
    result = CliRunner().invoke(cli, ["load", "--status", str(out / "nothing")])
    assert result.exit_code == 1 and result.output == f"Error: {out / 'nothing'} does not exist\n"
    script = "import sys, kl_cli.main; sys.argv = ['kl', 'load', '--status', sys.argv[1]]\n"
    script += "try:\n    kl_cli.main.main()\nexcept SystemExit:\n    pass\nprint('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True).stdout.endswith("False\n")


def test_text_and_json_value_formats(spark, root, tmp_path):
    root.create_topic("t")
    write(root, "t", [b'{"user": "ann", "n": 1}', b'{"user": "bob"}', b"not json", b"\xff\xfe"], timestamp=TS)
    load(root, tmp_path / "text", ["t"], settings=Settings(value_format="text"), spark=spark)
    table = ds.dataset(tmp_path / "text", format="parquet", partitioning="hive").to_table()
    assert table.schema.field("value").type == "string"
    assert table["value"].to_pylist() == ['{"user": "ann", "n": 1}', '{"user": "bob"}', "not json", "\ufffd\ufffd"]

    settings = Settings(value_format="json", schema="user string, n int")
    load(root, tmp_path / "json", ["t"], settings=settings, spark=spark)
    rows = (
        duckdb.connect()
        .execute(f"""select value, "user", n from read_parquet('{tmp_path / "json"}/**/*.parquet') order by "offset" """)
        .fetchall()
    )
    assert rows[:3] == [('{"user": "ann", "n": 1}', "ann", 1), ('{"user": "bob"}', "bob", None), ("not json", None, None)]

    with pytest.raises(kl.InvalidConfig, match="^schema field 'Offset' collides with kl's column 'offset'"):
        load(
            root, tmp_path / "bad", ["t"], settings=Settings(value_format="json", schema="user string, Offset long"), spark=spark
        )
    with pytest.raises(kl.InvalidConfig, match="^schema 'user strin g' is not a DDL schema"):
        load(root, tmp_path / "bad", ["t"], settings=Settings(value_format="json", schema="user strin g"), spark=spark)
    assert not (tmp_path / "bad").exists()
    result = cli_run(root, "t", "-o", str(tmp_path / "bad"), "--value-format", "json")
    assert result.exit_code == 2 and "--value-format json needs --schema DDL" in result.output


# ----------------------------------------------------------------- a topic deleted and created again


def recreate(root: kl.Root, topic: str, partitions: int = 1) -> None:
    root.delete_topic(topic)
    root.create_topic(topic, kl.TopicConfig(partitions=partitions))


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_recreated_topic_fails_the_load_or_with_on_recreated_restart_is_loaded_from_its_start(spark, root, out, partitions):
    root.create_topic("ev", kl.TopicConfig(partitions=partitions))
    for p in range(partitions):
        produce(root, "ev", 3, partition=p)
    load(root, out, ["ev"], spark=spark)
    first, old_id = expected(root, ["ev"]), root.topic_id("ev")
    recreate(root, "ev", partitions)
    for p in range(partitions):
        produce(root, "ev", 6, partition=p, tag="n")  # the same message size: the old offsets are message starts
    before = tree(out)

    result = cli_run(root, "ev", "-o", str(out))
    assert result.exit_code == 1 and result.output == (
        f"Error: topic ev was deleted and created again since this load journal (its topic id was {old_id},"
        f" it is {root.topic_id('ev')} now): load into another directory, or run with --on-recreated restart"
        " to load the new topic from its start\n"
    )
    assert tree(out) == before
    result = cli_run(root, "ev", "-o", str(out), "--dry-run", "--on-recreated", "restart")
    assert result.exit_code == 0 and f"would load {partitions * 6 * 32} bytes" in result.stderr
    [report] = load(root, out, ["ev"], limits=Limits(on_recreated="restart"), spark=spark)
    assert [(p.start, p.messages) for p in report.partitions] == [(0, 6)] * partitions
    assert_loaded(out, first + expected(root, ["ev"]))
    assert {c.topic_id for c in journal.status(out).partitions} == {root.topic_id("ev")}
    assert load(root, out, ["ev"], spark=spark)[0].partitions[0].messages == 0


def test_files_of_two_creations_never_share_a_name(spark, root, out):
    root.create_topic("ev")
    produce(root, "ev", 3)
    load(root, out, ["ev"], spark=spark)
    first = expected(root, ["ev"])
    recreate(root, "ev")
    produce(root, "ev", 3, tag="n")  # the same range, the same hour
    load(root, out, ["ev"], limits=Limits(on_recreated="restart"), spark=spark)
    names = sorted(p.name for p in out.rglob("*.parquet"))
    assert len(names) == 2 and all(name.startswith("p0-0-96-") for name in names)
    assert_loaded(out, first + expected(root, ["ev"]))


# ----------------------------------------------------------------- the journal, without Spark


def test_a_plan_cuts_ranges_at_segment_starts_only_and_reads_no_segment(root, monkeypatch):
    root.create_topic("t", ROLLING)
    produce(root, "t", 320)  # ten segments of 1024 bytes
    root.create_topic("one", kl.TopicConfig())
    produce(root, "one", 320)  # one segment of 10240 bytes

    def read(*_args, **_kwargs):
        raise AssertionError("planning read a segment")

    monkeypatch.setattr(kl.log.log.Log, "open_segment", read)
    plan = journal.plan_run(root, ["t", "one"], {}, Limits(), Settings(), task_bytes=3000)
    assert [(r.start, r.end) for r in plan.tasks if r.topic == "t"] == [(i, i + 2048) for i in range(0, 10240, 2048)]
    assert [(r.start, r.end) for r in plan.tasks if r.topic == "one"] == [(0, 10240)]


def test_plans_name_the_topic_id_and_offsets_of_another_creation_fail_or_restart(root):
    root.create_topic("ev", kl.TopicConfig(partitions=2))
    produce(root, "ev", 3)
    produce(root, "ev", 6, partition=1)
    old_id = root.topic_id("ev")
    committed = {("ev", 0): 64, ("ev", 1): 96}
    ids = dict.fromkeys(committed, old_id)
    plan = journal.plan_run(root, ["ev"], committed, Limits(), Settings(), topic_ids=ids)
    assert plan.topic_ids == {"ev": old_id} and [(r.start, r.end) for r in plan.tasks] == [(64, 96), (96, 192)]
    assert plan.file_name(plan.tasks[0]) == f"p0-64-96-{old_id[:8]}.parquet"
    # Offsets committed by a kl before topic ids count as the current creation's.
    assert journal.plan_run(root, ["ev"], committed, Limits(), Settings()).tasks == plan.tasks

    recreate(root, "ev")
    write(root, "ev", [b"n%03d-longer-than-before" % i for i in range(5)])  # 64 is inside a message now
    end = root.log("ev", 0).state().log_end_offset
    with pytest.raises(
        TopicRecreated, match=rf"^topic ev was deleted and created again since this load journal \(its topic id was {old_id}, "
    ):
        journal.plan_run(root, ["ev"], committed, Limits(), Settings(), topic_ids=ids)
    restarted = journal.plan_run(root, ["ev"], committed, Limits(on_recreated="restart"), Settings(), topic_ids=ids)
    assert [tuple(r) for r in restarted.tasks] == [("ev", 0, 0, end)] and restarted.topic_ids == {"ev": root.topic_id("ev")}


def test_an_unfinished_plan_of_another_creation_fails_or_its_ranges_are_recorded_lost(root, out):
    root.create_topic("ev")
    produce(root, "ev", 3)
    plan = journal.plan_run(root, ["ev"], {}, Limits(), Settings())
    j = journal.Journal(out)
    with j.locked():
        j.write_plan(plan)
    recreate(root, "ev")
    produce(root, "ev", 5, tag="n")
    ran = []

    def execute(journal_: journal.Journal, plan_: journal.Plan, todo: list[int], fail: bool) -> None:
        ran.append((plan_.run, todo))
        for i in todo:
            journal.write_done(journal_.task_dir(plan_.run), journal.Done(i, plan_.tasks[i], [], 0))

    with pytest.raises(TopicRecreated):
        journal.run(root, out, ["ev"], Limits(), Settings(), execute=execute)
    assert j.unfinished() == plan and ran == []
    with pytest.raises(TopicRecreated):
        journal.run(root, out, ["ev"], Limits(), Settings(), execute=None, dry_run=True)
    restart = Limits(on_recreated="restart")
    [would, _] = journal.run(root, out, ["ev"], restart, Settings(), execute=None, dry_run=True)
    assert would.partitions[0].lost == [(0, 96)]
    [resumed, new] = journal.run(root, out, ["ev"], restart, Settings(), execute=execute)
    assert resumed.resumed and resumed.partitions[0].lost == [(0, 96)]
    assert [run for run, _ in ran] == [new.run] and (new.partitions[0].start, new.partitions[0].end) == (0, 160)
    assert committed(out) == {("ev", 0): 160}


def test_a_damaged_load_journal_is_reported_never_reset(root, out):
    root.create_topic("ev")
    produce(root, "ev", 3)
    (out / "_kl").mkdir(parents=True)
    offsets = out / "_kl" / "offsets.json"
    line = {"offset": 32, "rows": 1, "run": "r", "loaded_at": "t", "topic_id": root.topic_id("ev")}
    settings = {"granularity": "hour", "value_format": "binary", "schema": None}

    def damaged(**change) -> str:
        offsets.write_text(json.dumps({"run": "r", "settings": settings, "topics": {"ev": {"0": {**line, **change}}}}))
        result = cli_run(root, "ev", "-o", str(out), "--dry-run")
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        return result.output

    assert "offsets.json is not a kl load journal file (ValueError: ev/0's offset 'x' is not a number >= 0)" in damaged(
        offset="x"
    )
    assert "ev/0's rows -1 is not a number >= 0" in damaged(rows=-1)
    assert "topic id 7 is not a topic id" in damaged(topic_id=7)
    assert damaged(offset=33).startswith("Error: the load journal's offset is not a message's start: offset 33 is not the start")
    assert damaged(offset=97) == (
        "Error: ev/0 is loaded up to offset 97, past its log end 96: the load journal does not match the topic (is it damaged?)\n"
    )
    offsets.write_text("")
    assert "offsets.json is not valid JSON" in cli_run(root, "ev", "-o", str(out), "--dry-run").output


# ----------------------------------------------------------------- crash points


def big_topic(root: kl.Root, partitions: int = 4, count: int = 20_000) -> None:
    root.create_topic("t", kl.TopicConfig(partitions=partitions))
    for p in range(partitions):
        write(root, "t", [b"%06d" % i + b"." * 94 for i in range(count)], partition=p, timestamp=TS + p * HOUR_MS)


def test_killed_while_spark_writes_then_a_rerun_loads_every_message_once(spark, root, out):
    big_topic(root)
    process = kl_load(root, "t", "-o", str(out), "--master", "local[1]")
    markers: list[Path] = []
    try:
        deadline = time.monotonic() + 300
        while not markers and process.poll() is None and time.monotonic() < deadline:
            markers = list(out.glob("_kl/runs/*/*.done"))
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        _, stderr = process.communicate()
    assert process.returncode == -signal.SIGKILL, stderr.decode()
    plan = journal.Journal(out).unfinished()
    assert plan is not None and 1 <= len(journal.Journal(out).done(plan)) < len(plan.tasks)
    assert_consistent(out, root, ["t"])
    assert committed(out) == {}
    before = tree(out)
    result = cli_run(root, "t", "-o", str(out), "--dry-run", "--json")
    assert result.exit_code == 0 and tree(out) == before
    assert f"run {plan.run} (finishing an interrupted run): would load {4 * 20_000 * 122:,} bytes" in result.stderr
    assert [json.loads(line)["resumed"] for line in result.stdout.splitlines()] == [True] * 4 + [False] * 4
    [resumed, new] = load(root, out, ["t"], spark=spark)
    assert resumed.resumed and resumed.run == plan.run and not new.resumed
    assert_loaded(out, expected(root, ["t"]))
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert journal.Journal(out).unfinished() is None


def test_killed_after_writing_during_and_after_the_commit_then_a_rerun_loads_every_message_once(spark, root, out):
    big_topic(root, partitions=2, count=200)
    load(root, out, ["t"], spark=spark)
    first = committed(out)
    for p in range(2):
        produce(root, "t", 50, partition=p, ts=TS + 3 * HOUR_MS)
    # A run whose tasks are all done (run here, with the test's Spark session), then
    # killed before it commits: the files are there once, the offsets as before.
    plan = journal.plan_run(root, ["t"], first, Limits(), Settings())
    journal.Journal(out).write_plan(plan)
    SparkRunner(root, spark, None, None)(journal.Journal(out), plan, [0, 1], True)
    process = kl_load(root, "t", "-o", str(out), kill_at="written")
    assert process.wait() == -signal.SIGKILL, process.stderr.read().decode()
    assert len(journal.Journal(out).done(plan)) == 2
    assert committed(out) == first
    assert_loaded(out, expected(root, ["t"]))

    # The new offsets in a temporary file, not renamed: nothing committed (and no Spark started).
    process = kl_load(root, "t", "-o", str(out), kill_at="commit")
    assert process.wait() == -signal.SIGKILL, process.stderr.read().decode()
    assert committed(out) == first and journal.Journal(out).unfinished() == plan
    assert [p.name for p in (out / "_kl").iterdir() if p.name.endswith(".tmp")]
    assert_loaded(out, expected(root, ["t"]))

    # Committed, the plan not yet removed: a re-run does not commit it twice.
    process = kl_load(root, "t", "-o", str(out), kill_at="committed")
    assert process.wait() == -signal.SIGKILL, process.stderr.read().decode()
    assert committed(out) == plan.ends() and journal.Journal(out).unfinished() == plan
    result = CliRunner().invoke(cli, ["load", "--status", str(out)])
    assert f"run {plan.run} is unfinished (2 of 2 tasks done)" in result.stdout

    produce(root, "t", 5, partition=1, tag="z")
    [resumed, new] = load(root, out, ["t"], spark=spark)
    assert resumed.run == plan.run and [p.messages for p in new.partitions] == [0, 5]
    assert_loaded(out, expected(root, ["t"]))
    assert {(c.topic, c.partition): c.rows for c in journal.status(out).partitions} == {("t", 0): 250, ("t", 1): 255}
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert os.listdir(out / "_kl" / "runs") == []


def test_a_run_beside_a_producer_loads_a_consistent_prefix(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    stop = threading.Event()

    def keep_producing() -> None:
        producer = kl.Producer(root)
        i = 0
        while not stop.is_set():
            producer.send_batch("t", [b"%08d" % (i + k) for k in range(50)], partition=i % 2)
            i += 50
            time.sleep(0.01)
        producer.close()

    thread = threading.Thread(target=keep_producing)
    thread.start()
    try:
        for _ in range(2):
            load(root, out, ["t"], spark=spark)
    finally:
        stop.set()
        thread.join()
    assert_loaded(out, expected(root, ["t"], upto=committed(out)))


def test_a_failing_task_is_one_error_line_and_the_plan_stays_to_be_finished(spark, root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 10, partition=0)
    produce(root, "t", 10, partition=1)
    segment = next((partition_dir(root, "t", 1)).glob("*.kl"))
    flip_byte(segment, 5 * 32 + 20)  # inside the sixth message's value: its checksum fails
    result = cli_run(root, "t", "-o", str(out))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].startswith("Error: corrupt message at offset 160 (")
    assert "Traceback" not in result.output and "Exception" not in result.output
    plan = journal.Journal(out).unfinished()
    assert plan is not None and committed(out) == {}
    flip_byte(segment, 5 * 32 + 20)  # repaired: the next run finishes the plan
    [resumed, _] = load(root, out, ["t"], spark=spark)
    assert resumed.run == plan.run
    assert_loaded(out, expected(root, ["t"]))


def test_a_timestamp_out_of_range_fails_naming_the_message_until_a_run_clamps_it(spark, root, out):
    root.create_topic("t")
    produce(root, "t", 3)
    far = root.log("t", 0).append(Checked.framed(frame([b"far"], 253402300800000), 1))  # year 10000, as old data may hold
    produce(root, "t", 2, tag="n")
    result = cli_run(root, "t", "-o", str(out))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].startswith(
        f"Error: topic 't' partition 0 offset {far}: timestamp 253402300800000 is outside the range kl stores, "
    )
    assert committed(out) == {}
    result = cli_run(root, "t", "-o", str(out), "--bad-timestamps", "clamp")  # finishes the same plan
    assert result.exit_code == 0, result.output
    assert sorted(p.parent.parent.name + "/" + p.parent.name for p in out.rglob("*.parquet")) == [
        "date=2023-11-14/hour=22",
        "date=9999-12-31/hour=23",
    ]
    assert_loaded(out, expected(root, ["t"]))


def test_a_task_error_comes_back_from_spark_as_the_error_it_was():
    worker = 'An exception was thrown from the Python worker:\nTraceback (most recent call last):\n  File "x", line 8\n'
    loss = PythonException(
        message=worker + "kl.spark.ranges.DataLoss: data loss: topic 't' partition 3 offsets 0 to 1024 were deleted"
        " by retention (set failOnDataLoss to false to skip them)"
    )
    error = unwrap(loss)
    assert isinstance(error, LoadDataLoss) and (error.loss.partition, error.loss.start, error.loss.end) == (3, 0, 1024)
    full = PythonException(message=worker + "OSError: [Errno 28] No space left on device")
    assert str(unwrap(full)) == "the Spark job failed: OSError: [Errno 28] No space left on device"


# ----------------------------------------------------------------- headers and null values


def test_headers_are_loaded_with_headers_and_null_values_are_null(spark, root, tmp_path):
    root.create_topic("h")
    with kl.Producer(root) as producer:
        producer.send("h", b"plain", timestamp=TS)
        producer.send("h", None, key=b"k", headers=[("trace", b"1"), ("gone", None)], timestamp=TS)
        producer.send("h", b'{"user": "ann"}', headers=[("t", b"\xff")], timestamp=TS)
    load(root, tmp_path / "with", ["h"], settings=Settings(headers=True), spark=spark)
    table = ds.dataset(tmp_path / "with", format="parquet", partitioning="hive").to_table().sort_by("offset")
    assert table["value"].to_pylist() == [b"plain", None, b'{"user": "ann"}']
    assert table["headers"].to_pylist() == [
        None,
        [{"key": "trace", "value": b"1"}, {"key": "gone", "value": None}],
        [{"key": "t", "value": b"\xff"}],
    ]
    load(root, tmp_path / "without", ["h"], spark=spark)
    assert "headers" not in ds.dataset(tmp_path / "without", format="parquet", partitioning="hive").schema.names
    with pytest.raises(kl.InvalidConfig, match="written with --granularity hour --value-format binary; .* --headers"):
        load(root, tmp_path / "without", ["h"], settings=Settings(headers=True), spark=spark)

    settings = Settings(value_format="json", schema="user string", headers=True)
    load(root, tmp_path / "json", ["h"], settings=settings, spark=spark)
    table = ds.dataset(tmp_path / "json", format="parquet", partitioning="hive").to_table().sort_by("offset")
    assert table["user"].to_pylist() == [None, None, "ann"]
    assert table["headers"].to_pylist()[2] == [{"key": "t", "value": b"\xff"}]
    with pytest.raises(kl.InvalidConfig, match="collides with kl's column 'headers'"):
        load(
            root,
            tmp_path / "bad",
            ["h"],
            settings=Settings(value_format="json", schema="headers string", headers=True),
            spark=spark,
        )
