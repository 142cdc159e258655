"""The ``kl`` batch source on a real local Spark session (the shared ``spark`` fixture)."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import pkgutil
import subprocess
import sys
import time

import pytest

import kl
from kl.log.importer import import_topic
from kl.log.retention import retain
from kl.log.validate import Checked
from kl.spark import ranges
from kl.timespec import TIME_FORMS

from conftest import KAFKA07_SEGMENT, active_segment, flip_byte

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
SMALL = kl.TopicConfig(partitions=3, segment_bytes=16 << 10, max_message_bytes=8 << 10, flush_ms=0)


def fill_events(root: kl.Root) -> None:
    """Three partitions over several segments: plain, keyed, binary, gzip and zstd batches."""
    root.create_topic("events", SMALL)
    with kl.Producer(root) as plain, kl.Producer(root, compression="gzip") as gz, kl.Producer(root, compression="zstd") as zs:
        for p in range(3):
            plain.send_batch("events", [b"v%d-%05d" % (p, i) for i in range(700)], partition=p, timestamp=T0 + p)
            plain.send_batch("events", [bytes(range(256)), b"", b"\n\x00"], keys=[b"k", None, b""], partition=p, timestamp=T0)
            gz.send_batch("events", [b"gz%d-%d" % (p, i) for i in range(50)], partition=p, timestamp=T0 + 10)
            zs.send_batch("events", [b"zs%d-%d" % (p, i) for i in range(50)], keys=[b"z"] * 50, partition=p, timestamp=T0 + 20)
            plain.send_batch("events", [b"tail%d-%d" % (p, i) for i in range(300)], partition=p, timestamp=T0 + 3_600_000)


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> kl.Root:
    root = kl.Root(tmp_path_factory.mktemp("spark-source") / "root")
    fill_events(root)
    return root


def read(spark, root: kl.Root | str, **options):
    reader = spark.read.format("kl").option("root", str(getattr(root, "path", root)))
    for key, value in options.items():
        reader = reader.option(key, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


def rows(df) -> list[tuple]:
    """Every row, sorted, its timestamp in epoch milliseconds (Python would shift it to the local zone)."""
    df = df.selectExpr("topic", "partition", "offset", "nextOffset", "key", "value", "unix_millis(timestamp) as ts")
    return sorted((r.topic, r.partition, r.offset, r.nextOffset, r.key, r.value, r.ts) for r in df.collect())


def kl_rows(root: kl.Root, topic: str) -> list[tuple]:
    out = []
    for batch in kl.Consumer(root).consume(topic):
        for m in batch.messages:
            out.append((topic, batch.partition, m.offset, m.next_offset, m.key, m.value, m.timestamp))
    return sorted(out)


def error_of(call) -> str:
    with pytest.raises(Exception) as caught:
        call()
    return str(caught.value)


# ----------------------------------------------------------------- what it reads


def test_a_batch_read_gives_what_kl_consume_writes_byte_for_byte(spark, events):
    df = read(spark, events, topics="events")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,nextOffset:bigint,timestamp:timestamp>"
    )
    got = df.selectExpr("*", "unix_millis(timestamp) as ts").orderBy("partition", "offset").collect()
    lines = subprocess.run(
        [sys.executable, "-m", "kl_cli", "--root", events.path, "consume", "events", "--json"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.splitlines()
    everything = [json.loads(line) for line in lines]
    for p in range(3):
        mine = [r for r in got if r.partition == p]
        out = subprocess.run(
            [sys.executable, "-m", "kl_cli", "--root", events.path, "consume", "events", "-p", str(p), "--binary"],
            capture_output=True,
            check=True,
        ).stdout
        assert b"".join(r.value for r in mine) == out
        expected = [e for e in everything if e["partition"] == p]
        assert [(r.offset, r.nextOffset) for r in mine] == [(e["offset"], e["next_offset"]) for e in expected]
        assert [r.ts for r in mine] == [e["timestamp"] for e in expected]
    assert len(got) == 3 * (700 + 3 + 50 + 50 + 300)


def test_keys_binary_values_and_compressed_batches_come_through(spark, events):
    assert rows(read(spark, events, topics="events")) == kl_rows(events, "events")
    keyed = read(spark, events, topics="events").where("key is not null").collect()
    assert sorted({bytes(r.key) for r in keyed}) == [b"", b"k", b"z"]
    assert {bytes(r.value) for r in keyed if r.key == b"k"} == {bytes(range(256))}
    gz = read(spark, events, topics="events").where("value like 'gz0-%'").orderBy("nextOffset").collect()
    assert len(gz) == 50 and len({r.offset for r in gz}) == 1  # one wrapper: every inner message at its offset


def test_timestamps_are_utc(spark, events):
    df = read(spark, events, topics="events").where("partition = 2 and offset = 0")
    (first,) = df.selectExpr("date_format(timestamp, 'yyyy-MM-dd HH:mm:ss.SSS') as at", "unix_millis(timestamp) as ms").collect()
    assert (first.at, first.ms) == ("2023-11-14 22:13:20.002", T0 + 2)


def test_ranges_split_at_message_boundaries_give_the_same_rows(spark, events):
    whole = rows(read(spark, events, topics="events"))
    for options in ({"minPartitions": "17"}, {"maxBytesPerPartition": "3000"}):
        df = read(spark, events, topics="events", **options)
        assert df.rdd.getNumPartitions() >= 17 if "minPartitions" in options else df.rdd.getNumPartitions() > 3
        assert rows(df) == whole, options


def test_a_split_never_lands_inside_a_message(events):
    planned = ranges.plan(events, ["events"])
    consumer = kl.Consumer(events)
    for max_bytes in (1, 500):
        pieces = ranges.split(events, planned, max_bytes=max_bytes)
        assert len(pieces) > 30
        for piece in pieces:
            consumer.check_offset(piece.topic, piece.partition, piece.start)
        assert sum(p.size for p in pieces) == sum(r.size for r in planned)
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False) if a.partition == b.partition)
    one_each = ranges.split(events, planned, max_bytes=1)
    assert len(one_each) == 3 * (700 + 3 + 1 + 1 + 300)  # every stored message (a batch is one) its own piece


# ----------------------------------------------------------------- options


def test_topics_and_topic_pattern(spark, tmp_path):
    root = kl.Root(tmp_path / "root")
    for name in ("web.clicks", "web.views", "db.rows"):
        root.create_topic(name)
        kl.Producer(root).send_batch(name, [name.encode()] * 3)
    assert (
        sorted(r.topic for r in read(spark, root, topics="web.clicks, db.rows").collect()) == ["db.rows"] * 3 + ["web.clicks"] * 3
    )
    assert {r.topic for r in read(spark, root, topicPattern=r"web\..*").collect()} == {"web.clicks", "web.views"}
    assert "exactly one of the options topics and topicPattern" in error_of(lambda: read(spark, root).count())
    assert "topic 'nope' does not exist" in error_of(lambda: read(spark, root, topics="nope").count())


def test_starting_and_ending_offsets(spark, events):
    end0 = events.log("events", 0).log_end_offset
    assert read(spark, events, topics="events", startingOffsets="latest").count() == 0
    assert read(spark, events, topics="events", endingOffsets="earliest").count() == 0
    one = read(spark, events, topics="events", startingOffsets={"events": {"0": 90, "1": -1, "2": -1}})
    got = one.orderBy("offset").collect()
    assert {r.partition for r in got} == {0} and got[0].offset == 90 and got[-1].nextOffset == end0
    both = read(
        spark,
        events,
        topics="events",
        startingOffsets={"events": {"1": -2}},
        endingOffsets={"events": {"0": 60, "1": 30, "2": -2}},
    )
    assert sorted((r.partition, r.offset) for r in both.collect()) == [(0, 0), (0, 30), (1, 0)]


def test_offsets_are_checked(spark, events):
    assert "not the start of a message" in error_of(
        lambda: read(spark, events, topics="events", startingOffsets={"events": {"0": 5}}).count()
    )
    assert "offset 31 is not the start of a message" in error_of(
        lambda: read(spark, events, topics="events", endingOffsets={"events": {"0": 31}}).count()
    )
    assert "past the log end" in error_of(
        lambda: read(spark, events, topics="events", endingOffsets={"events": {"0": 10**12}}).count()
    )
    assert "names partition 7" in error_of(
        lambda: read(spark, events, topics="events", startingOffsets={"events": {"7": 0}}).count()
    )
    assert "startingOffsets must be earliest, latest or JSON" in error_of(
        lambda: read(spark, events, topics="events", startingOffsets="first").count()
    )


def test_starting_and_ending_timestamps(spark, events):
    late = read(spark, events, topics="events", startingTimestamp=str(T0 + 3_600_000))
    assert {bytes(r.value)[:4] for r in late.collect()} == {b"tail"}
    assert late.count() == 900
    early = read(spark, events, topics="events", endingTimestamp=str(T0 + 10))
    assert early.where("value like 'gz%' or value like 'tail%'").count() == 0
    assert early.count() == 3 * 703  # up to the gzip batches, stamped T0+10


def test_timestamps_take_every_time_form_of_kl(spark, events):
    from kl.spark.options import Options

    start, end = "2023-11-14T22:13:20Z", "2023-11-14T22:13:20.010Z"
    iso = read(spark, events, topics="events", startingTimestamp=start, endingTimestamp=end)
    assert iso.count() == 3 * 703  # T0 to T0 + 10, as in milliseconds
    parsed = Options.parse({"root": "/r", "startingTimestamp": "-1h", "endingTimestamp": "now"})
    assert parsed.ending_timestamp - parsed.starting_timestamp == 3_600_000
    assert parsed.ending_timestamp <= time.time_ns() // 1_000_000
    with pytest.raises(kl.InvalidConfig) as bad:
        Options.parse({"root": "/r", "endingTimestamp": "soon"})
    assert str(bad.value) == f"endingTimestamp: 'soon' is not a time: give {TIME_FORMS}"


def test_unknown_and_bad_options_are_named(spark, events):
    assert "unknown option 'startingoffset' of the kl source (did you mean startingOffsets?)" in error_of(
        lambda: read(spark, events, topics="events", startingOffset="earliest").count()
    )
    assert "failOnDataLoss must be true or false" in error_of(
        lambda: read(spark, events, topics="events", failOnDataLoss="maybe").count()
    )
    assert "minPartitions must be a whole number" in error_of(
        lambda: read(spark, events, topics="events", minPartitions="-3").count()
    )
    assert 'needs option("root", DIR)' in error_of(lambda: spark.read.format("kl").option("topics", "x").load().count())
    assert "does not exist (is it mounted?)" in error_of(lambda: read(spark, "/nonexistent/kl", topics="x").count())


# ----------------------------------------------------------------- a busy topic, retention, damage


def _produce_for(path: str, seconds: float) -> None:
    producer = kl.Producer(kl.Root(path))
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        producer.send_batch("busy", [b"m%08d" % (i + k) for k in range(50)], partition=i % 2)
        i += 50
    producer.close()


def test_a_busy_topic_gives_a_finite_contiguous_repeatable_result(spark, tmp_path):
    root = kl.Root(tmp_path / "root")
    root.create_topic("busy", kl.TopicConfig(partitions=2, segment_bytes=64 << 10, max_message_bytes=1024))
    kl.Producer(root).send_batch("busy", [b"first"] * 100, partition=0)
    writer = multiprocessing.get_context("spawn").Process(target=_produce_for, args=(root.path, 20.0))
    writer.start()
    try:
        deadline = time.monotonic() + 60  # the spawned writer imports this module (and Spark's) first
        while root.log("busy", 0).log_end_offset == 2700 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = read(spark, root, topics="busy").orderBy("partition", "offset").collect()
        for p in range(2):
            chain = [r for r in got if r.partition == p]
            assert all(a.nextOffset == b.offset for a, b in zip(chain, chain[1:], strict=False))  # nothing missing in between
        ends = {str(p): max((r.nextOffset for r in got if r.partition == p), default=0) for p in range(2)}
        again = read(spark, root, topics="busy", endingOffsets={"busy": ends}).orderBy("partition", "offset").collect()
        assert again == got
        assert root.log("busy", 0).log_end_offset > ends["0"] or root.log("busy", 1).log_end_offset > ends["1"]
    finally:
        writer.terminate()
        writer.join()


def aged_topic(root: kl.Root) -> None:
    """Partition 0: four closed segments stamped long ago, then young data."""
    root.create_topic("aged", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_ms=0))
    with kl.Producer(root) as producer:
        for k in range(4):
            producer.send_batch("aged", [b"s%02dm%06d" % (k, i) for i in range(32)], partition=0, timestamp=T0 + k)
        producer.send_batch("aged", [b"young%04d" % i for i in range(3)], partition=0, timestamp=T0 + 10**10)


def test_data_deleted_by_retention_fails_or_is_skipped(spark, tmp_path):
    root = kl.Root(tmp_path / "root")
    aged_topic(root)
    retain(root.log("aged", 0), max_age_ms=10**9, now_ms=T0 + 5 * 10**9, delete_delay=0)
    start = root.log("aged", 0).log_start_offset
    assert start >= 3 * 1024
    message = error_of(lambda: read(spark, root, topics="aged", startingOffsets={"aged": {"0": 1024}}).count())
    assert f"data loss: topic 'aged' partition 0 offsets 1024 to {start} were deleted by retention" in message
    kept = read(spark, root, topics="aged", startingOffsets={"aged": {"0": 1024}}, failOnDataLoss="false")
    assert rows(kept) == kl_rows(root, "aged")  # from the log start on


def test_damage_fails_the_task_naming_topic_partition_and_offset_or_is_skipped(spark, tmp_path):
    root = kl.Root(tmp_path / "root")
    root.create_topic("dmg", kl.TopicConfig(partitions=2, flush_ms=0))
    kl.Producer(root).send_batch("dmg", [b"%04d" % i for i in range(100)], partition=1)
    kl.Producer(root).flush()
    flip_byte(active_segment(root, "dmg", 1), 26 * 10 + 24)  # inside message 10's value
    message = error_of(lambda: read(spark, root, topics="dmg").count())
    assert "corrupt message at offset 260" in message and "(topic 'dmg' partition 1)" in message
    got = read(spark, root, topics="dmg", skipCorrupt="true").orderBy("offset").collect()
    assert [bytes(r.value) for r in got] == [b"%04d" % i for i in range(100) if i != 10]


def test_a_kafka_07_partition_reads_with_null_keys_and_timestamps(spark, tmp_path):
    source = tmp_path / "legacy-0"
    source.mkdir()
    (source / KAFKA07_SEGMENT.name).write_bytes(KAFKA07_SEGMENT.read_bytes())
    root = kl.Root(tmp_path / "root")
    import_topic(root, "legacy", [str(source)])
    got = read(spark, root, topics="legacy").orderBy("offset").collect()
    assert len(got) == 100
    assert {(r.key, bytes(r.value), r.timestamp) for r in got} == {(None, b"x" * 100, None)}  # no key or time in magic 0
    assert [r.offset for r in got] == list(range(0, 100 * 109, 109))


# ----------------------------------------------------------------- packaging


def test_import_kl_never_imports_pyspark():
    code = "import sys, kl, kl.spark, kl.spark.ranges; sys.exit('pyspark' in sys.modules or 'pyarrow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_pyspark_finds_the_kl_source_by_itself():
    """pyspark registers the ``DefaultSource`` of every installed ``pyspark_*`` module
    (pyspark.sql.worker.lookup_data_sources): installing kl is enough."""
    from pyspark.sql.datasource import DataSource

    found = {info.name for info in pkgutil.iter_modules() if info.name.startswith("pyspark_")}
    assert "pyspark_kl" in found
    source = importlib.import_module("pyspark_kl").DefaultSource
    assert issubclass(source, DataSource) and source.name() == "kl"


def test_without_java_the_session_says_what_to_install():
    code = "from kl.spark.session import session; session()"
    env = {"PATH": "/nonexistent", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "kl.spark.session.JavaNotFound: Spark needs a Java runtime (17 or newer) and none was found" in done.stderr


def test_a_schema_picks_columns(spark, events):
    base = spark.read.format("kl").option("root", events.path).option("topics", "events")
    picked = base.schema("offset long, value binary").load()
    assert picked.columns == ["offset", "value"]
    assert sorted((r.offset, r.value) for r in picked.collect()) == sorted(
        (r[2], r[5]) for r in kl_rows(events, "events")
    )
    assert "the kl source has no column value string" in error_of(lambda: base.schema("value string").load().count())
    assert "the kl source has no column size bigint" in error_of(lambda: base.schema("size long").load().count())


def test_a_timestamp_out_of_range_fails_naming_the_message_or_reads_as_null_or_clamped(spark, root):
    from kl.log.messageset import frame

    root.create_topic("far")
    root.log("far", 0).append(Checked.framed(frame([b"a"], 1000) + frame([b"b"], 9223372036854775807), 2))
    assert "topic 'far' partition 0 offset 23: timestamp 9223372036854775807 is outside the range kl stores" in error_of(
        lambda: read(spark, root, topics="far").collect()
    )
    def stamps(policy: str) -> list[int | None]:
        df = read(spark, root, topics="far", badTimestamps=policy)
        return [r.ts for r in df.selectExpr("unix_millis(timestamp) as ts").collect()]

    assert stamps("null") == [1000, None]
    assert stamps("clamp") == [1000, kl.log.message.MAX_TIMESTAMP]
    assert "option badTimestamps must be one of fail, clamp, null, not 'wrap'" in error_of(
        lambda: read(spark, root, topics="far", badTimestamps="wrap").collect()
    )


# ----------------------------------------------------------------- headers and null values


def test_include_headers_gives_sparks_kafka_headers_column_and_null_values_are_null(spark, root):
    root.create_topic("h", kl.TopicConfig(partitions=1))
    with kl.Producer(root) as plain, kl.Producer(root, compression="zstd") as zs:
        plain.send("h", b"plain", timestamp=T0)
        plain.send("h", None, key=b"k", headers=[("trace", b"1"), ("trace", b"\xff"), ("gone", None)], timestamp=T0)
        zs.send_batch("h", [b"", None], headers=[[("in", b"batch")], None], timestamp=T0)
    df = read(spark, root, topics="h", includeHeaders="true")
    assert df.schema.simpleString().endswith(",timestamp:timestamp,headers:array<struct<key:string,value:binary>>>")
    got = [(r.value, r.headers) for r in df.orderBy("nextOffset").collect()]
    assert [value for value, _ in got] == [b"plain", None, b"", None]
    assert [None if h is None else [(x.key, x.value) for x in h] for _, h in got] == [
        None, [("trace", b"1"), ("trace", b"\xff"), ("gone", None)], [("in", b"batch")], None,
    ]
    assert "headers" not in read(spark, root, topics="h").columns
    picked = spark.read.format("kl").option("root", root.path).option("topics", "h").option("includeHeaders", "true")
    assert picked.schema("offset long, headers array<struct<key:string,value:binary>>").load().count() == 4
    assert "includeHeaders must be true or false" in error_of(lambda: read(spark, root, topics="h", includeHeaders="yes").count())
