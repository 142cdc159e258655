"""``kl load`` and the ``kl`` source on a real Spark standalone cluster (tests/sparkcluster.py):
a Master and two Workers started from pyspark's own ``spark-class``, each its own JVM with
its own executor.  Exactly once under the cluster's own failures, each followed by a
re-run: a Worker killed with SIGKILL (its executor with it) while its task writes,
speculative copies of a slow task writing the same files at once, the driver killed while
the executors write.  Meanwhile a reader polls DIR with pyarrow and never sees a partial
file or a message twice.  The crash points after the Spark job (``written``, ``commit``,
``committed``) are the driver's alone, the same on any master: tests/test_load.py has them."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest
import sparkcluster
from lakecheck import assert_loaded, committed, expected, with_duckdb, with_pyarrow

import kl
from kl.spark import journal

from conftest import write

pytestmark = pytest.mark.spark

TS = 1_700_000_000_000
HOUR_MS = 3600 * 1000
KL = [sys.executable, "-m", "kl_cli"]
SLOW = "600"
"""Seconds the first attempt of a slowed task waits (``KL_LOAD_SLOW_TASK``): until it is killed."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sparkcluster.Cluster]:
    """One cluster for the module; afterwards not one of its processes is left."""
    why = sparkcluster.available()
    if why:
        pytest.skip(why)
    seen: set[int] = set()
    with sparkcluster.Cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c
        seen.update(c.processes())
    assert seen and not [pid for pid in seen if sparkcluster.alive(pid)]


@pytest.fixture
def spark_cluster(cluster: sparkcluster.Cluster) -> sparkcluster.Cluster:
    """The cluster with both Workers up and no application running."""
    for i, worker in enumerate(cluster.workers):
        if worker is None:
            cluster.start_worker(i)
    cluster.wait_idle()
    return cluster


def topic(root: kl.Root, name: str, partitions: int = 4, count: int = 2000) -> collections.Counter:
    """A topic of ``partitions`` partitions, each in two hours; what kl.Consumer reads of it."""
    root.create_topic(name, kl.TopicConfig(partitions=partitions))
    for p in range(partitions):
        for hour in range(2):
            write(
                root,
                name,
                [b"%d-%06d" % (p, i) + b"." * 90 for i in range(count // 2)],
                partition=p,
                timestamp=TS + hour * HOUR_MS,
            )
    return expected(root, [name])


def kl_load(cluster: sparkcluster.Cluster, root: kl.Root, *args: str, executor_env=(), **env: str) -> subprocess.Popen:
    """``kl load ... --master spark://...`` as a real process in its own session;
    ``executor_env`` (name, value) pairs reach the executors (``spark.executorEnv``)."""
    conf = [f"--conf spark.executorEnv.{k}={v}" for k, v in executor_env]
    environment = cluster.env(**env)
    environment.pop(journal.KILL_ENV, None)
    environment.update(env)
    environment["PYSPARK_SUBMIT_ARGS"] = " ".join([*conf, environment.get("PYSPARK_SUBMIT_ARGS", ""), "pyspark-shell"])
    return subprocess.Popen(
        [*KL, "--root", str(root.path), "load", *args, "--master", cluster.url],
        env=environment,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr.decode(errors="replace")


class Reader(threading.Thread):
    """Reads DIR whole with pyarrow again and again while a load runs: every snapshot must
    be whole files, each message at most once and each one of ``real``."""

    def __init__(self, out: Path, real: collections.Counter):
        super().__init__(daemon=True)
        self.out, self.real = out, real
        self.stop = threading.Event()
        self.snapshots: list[int] = []
        self.problems: list[str] = []
        self.hidden: set[str] = set()

    def run(self) -> None:
        watcher = threading.Thread(target=self._watch_hidden, daemon=True)
        watcher.start()
        while not self.stop.is_set():
            try:
                got = with_pyarrow(self.out)
            except Exception as e:  # an unreadable file
                self.problems.append(f"{type(e).__name__}: {e}")
                continue
            if max(got.values(), default=1) > 1 or got - self.real:
                self.problems.append(f"a snapshot of {sum(got.values())} rows holds a duplicate or a stranger")
            self.snapshots.append(sum(got.values()))
            time.sleep(0.05)

    def _watch_hidden(self) -> None:
        """Notes the temporary files every 10 ms, apart from the reads: a slow attempt's may
        live only while the other attempt runs, less than one read of DIR on a busy machine."""
        while not self.stop.is_set():
            try:
                self.hidden.update(p.name for p in self.out.glob("topic=*/**/.*.tmp"))
            except OSError:  # a directory went while it was listed
                pass
            time.sleep(0.01)

    def __enter__(self) -> Reader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()
        assert not self.problems, self.problems[:3]
        assert self.snapshots == sorted(self.snapshots), "a reader saw rows go away"


def task_log(cluster: sparkcluster.Cluster) -> dict[int, str]:
    """Per Worker, the executor logs of its newest application (what its executor ran)."""
    out = {}
    for i in range(len(cluster.workers)):
        apps = sorted(cluster.work_dir(i).glob("app-*"))
        out[i] = "".join(p.read_text(errors="replace") for p in apps[-1].glob("*/stderr")) if apps else ""
    return out


def wait_for(condition, what: str, process: subprocess.Popen | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process is None or process.poll() is None, f"kl load ended ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def no_tmp_left(out: Path) -> bool:
    return not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


# ----------------------------------------------------------------- running on the cluster


def test_kl_load_submitted_as_the_readme_says_runs_its_tasks_in_both_workers_executors(spark_cluster, root, tmp_path):
    real = topic(root, "t", partitions=3)
    driver = tmp_path / "kl-load.py"
    driver.write_text("from kl_cli.main import main; main()\n")
    submit = [os.path.join(sparkcluster.SPARK_HOME, "bin", "spark-submit"), "--master", spark_cluster.url]
    submit += ["--conf", f"spark.pyspark.python={sys.executable}", str(driver)]
    process = subprocess.run(
        [*submit, "--root", str(root.path), "load", "t", "--output", str(tmp_path / "lake")],
        env=spark_cluster.env(),
        capture_output=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr.decode(errors="replace")[-3000:]
    assert "loaded 6,000 messages" in process.stdout.decode()  # spark-submit passes the driver's stderr to its stdout
    assert_loaded(tmp_path / "lake", real)
    assert committed(tmp_path / "lake") == {("t", p): root.log("t", p).state().log_end_offset for p in range(3)}
    tasks = [re.findall(r"Running task (\d+)\.\d+ in stage", log) for log in task_log(spark_cluster).values()]
    assert all(tasks), f"a Worker's executor ran no task: {tasks}"  # the tasks ran in both executors
    assert sorted(int(t) for ts in tasks for t in ts) == [0, 1, 2]


SOURCE_AND_STREAM = textwrap.dedent(
    """
    import json, os, sys
    from kl.spark.session import session

    master, root, out = sys.argv[1:]
    spark = session(master, app_name="kl source on a cluster")
    df = spark.read.format("kl").option("root", root).option("topics", "t").load()
    where = df.rdd.mapPartitions(lambda rows: [(os.getpid(), os.getcwd(), sum(1 for _ in rows))]).collect()
    query = (
        spark.readStream.format("kl").option("root", root).option("topics", "t")
        .option("startingOffsets", "earliest").load()
        .writeStream.format("parquet").option("path", out).option("checkpointLocation", out + ".checkpoint")
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    print(json.dumps({"driver": os.getpid(), "where": where}))
    spark.stop()
    """
)


def test_the_kl_source_and_an_available_now_stream_run_on_the_cluster(spark_cluster, root, tmp_path):
    real = topic(root, "t", partitions=2, count=500)
    script = tmp_path / "job.py"
    script.write_text(SOURCE_AND_STREAM)
    out = tmp_path / "stream"
    process = subprocess.run(
        [sys.executable, str(script), spark_cluster.url, str(root.path), str(out)],
        env=spark_cluster.env(),
        capture_output=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr.decode(errors="replace")[-3000:]
    result = json.loads(process.stdout.decode().splitlines()[-1])
    workers = [str(spark_cluster.work_dir(i)) for i in range(2)]
    assert sum(n for _, _, n in result["where"]) == sum(real.values())
    for pid, cwd, _ in result["where"]:  # each task in a Python worker of an executor, in its work directory
        assert pid != result["driver"] and any(cwd.startswith(w + "/app-") for w in workers), (pid, cwd)
    # The stream's files, written by the executors: every message once, for pyarrow and DuckDB.
    assert with_pyarrow_stream(out) == real
    query = f"select topic, partition, \"offset\", value from read_parquet('{out}/*.parquet')"
    rows = duckdb.connect().execute(query).fetchall()
    assert collections.Counter((t, p, o, bytes(v)) for t, p, o, v in rows) == real


def with_pyarrow_stream(out: Path) -> collections.Counter:
    """The rows of a streaming query's Parquet files (its ``_spark_metadata`` skipped)."""
    table = ds.dataset(out, format="parquet").to_table()
    rows = zip(*(table[c].to_pylist() for c in ("topic", "partition", "offset", "value")), strict=True)
    return collections.Counter(rows)


# ----------------------------------------------------------------- failures of the cluster


def test_speculative_copies_of_a_slow_task_write_its_files_at_once_and_each_message_is_there_once(spark_cluster, root, tmp_path):
    real = topic(root, "t")
    out = tmp_path / "lake"
    speculation = "--conf spark.speculation=true --conf spark.speculation.efficiency.enabled=false"
    with Reader(out, real) as reader:
        process = kl_load(
            spark_cluster,
            root,
            "t",
            "-o",
            str(out),
            executor_env=[(journal.SLOW_ENV, f"0:{SLOW}")],
            PYSPARK_SUBMIT_ARGS=speculation,
        )
        code, stderr = finish(process)
    assert code == 0, stderr
    logs = "".join(task_log(spark_cluster).values())
    # Task 0's first attempt wrote its files and waited to rename them; a second attempt,
    # on the other Worker, wrote and renamed the same files; the first was then killed.
    assert "Finished task 0.1 in stage 0.0" in logs and "Finished task 0.0" not in logs
    assert re.search(r"kill task 0\.0 in stage 0\.0 .*another attempt succeeded", logs)
    assert [name for name in reader.hidden if name.startswith(".p0-")], "the slow attempt's files were not seen"
    assert_loaded(out, real)
    spark_cluster.wait_idle()
    assert no_tmp_left(out)
    code, stderr = finish(kl_load(spark_cluster, root, "t", "-o", str(out)))  # a re-run: nothing new
    assert code == 0 and "loaded 0 messages" in stderr, stderr
    assert_loaded(out, real)


def test_the_driver_killed_while_the_executors_write_then_a_rerun_loads_each_message_once(spark_cluster, root, tmp_path):
    real = topic(root, "t")
    out = tmp_path / "lake"
    with Reader(out, real) as reader:
        # Killed while the executors write: three tasks done, task 0 holding its files.
        process = kl_load(spark_cluster, root, "t", "-o", str(out), executor_env=[(journal.SLOW_ENV, f"0:{SLOW}")])
        wait_for(
            lambda: len(list(out.glob("_kl/runs/*/*.done"))) == 3 and any(n.startswith(".p0-") for n in reader.hidden),
            "three tasks done and task 0 writing",
            process,
        )
        os.killpg(process.pid, signal.SIGKILL)
        assert finish(process)[0] == -signal.SIGKILL
        plan = journal.Journal(out).unfinished()
        assert plan is not None and sorted(journal.Journal(out).done(plan)) == [1, 2, 3]
        assert committed(out) == {}

        # The next run finishes task 0 on the cluster, commits, and finds nothing new.
        code, stderr = finish(kl_load(spark_cluster, root, "t", "-o", str(out)))
    assert code == 0, stderr
    assert f"run {plan.run} (finishing an interrupted run): loaded 8,000 messages" in stderr
    assert_loaded(out, real)
    assert {(c.topic, c.partition): c.rows for c in journal.status(out).partitions} == {("t", p): 2000 for p in range(4)}
    assert no_tmp_left(out) and os.listdir(out / "_kl" / "runs") == []


def test_a_worker_killed_while_its_task_writes_then_spark_retries_it_elsewhere_and_a_rerun_loads_nothing_twice(
    spark_cluster, root, tmp_path
):
    real = topic(root, "t")
    out = tmp_path / "lake"
    with Reader(out, real) as reader:
        process = kl_load(spark_cluster, root, "t", "-o", str(out), executor_env=[(journal.SLOW_ENV, f"0:{SLOW}")])
        wait_for(lambda: any(n.startswith(".p0-") for n in reader.hidden), "task 0 writing", process)
        [victim] = [i for i, log in task_log(spark_cluster).items() if "Running task 0.0 in stage 0.0" in log]
        spark_cluster.kill_worker(victim)  # SIGKILL: the Worker, its executor, its Python workers
        code, stderr = finish(process)
    assert code == 0, stderr
    survivor = task_log(spark_cluster)[1 - victim]
    assert "Finished task 0.1 in stage 0.0" in survivor
    assert_loaded(out, real)
    assert no_tmp_left(out)
    code, stderr = finish(kl_load(spark_cluster, root, "t", "-o", str(out)))
    assert code == 0 and "loaded 0 messages" in stderr, stderr
    assert_loaded(out, real)
    assert with_duckdb(out) == real
