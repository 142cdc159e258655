"""``spark.readStream.format("kl")``: micro-batches from checkpointed offsets, caps,
availableNow, new topics, retention gaps (a real local Spark session, shared).

Queries write Parquet with Spark's file sink (exactly once, restartable), not through
``foreachBatch``: py4j's callback server selects on its socket, which fails once the
test process holds 1024 descriptors."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

import pytest

import kl
from kl.errors import InvalidConfig, TopicRecreated
from kl.log.retention import retain
from kl.spark import arrow, stream
from kl.spark.ranges import DataLoss
from kl.spark.stream import KlStreamReader, stream_options

from conftest import active_segment, flip_byte, read_all, write

pytestmark = pytest.mark.spark

limits = pytest.mark.skipif(
    not stream.ADMISSION_CONTROL, reason="pyspark before 4.2 passes no read limit; the caps are refused (tested)"
)


def reader(root: kl.Root, **options: str) -> KlStreamReader:
    return KlStreamReader(stream_options({"root": str(root.path), **options}))


class Run(NamedTuple):
    rows: list[tuple]
    """The rows the run added to the output, as (topic, partition, offset, value), sorted."""
    sizes: list[int]
    """The rows of each micro-batch that read any."""
    error: str | None


def run(spark, root: kl.Root, checkpoint: Path, *, during=None, fails: bool = False, once: bool = False, **options: str) -> Run:
    """One availableNow (or ``once``) run of a stream from ``checkpoint`` to Parquet
    beside it.  The output never holds a row twice.  ``during(query)`` runs while the
    query does; a run that fails raises, unless ``fails`` asks for its error."""
    df = spark.readStream.format("kl").option("root", str(root.path))
    for key, value in options.items():
        df = df.option(key, value)
    output = checkpoint.with_name(checkpoint.name + "-out")
    before = output_rows(spark, output)
    writer = df.load().writeStream.format("parquet").option("path", str(output)).option("checkpointLocation", str(checkpoint))
    query = (writer.trigger(once=True) if once else writer.trigger(availableNow=True)).start()
    error = None
    try:
        if during is not None:
            during(query)
        query.awaitTermination(120)
        assert not query.isActive, "the query did not finish"
    except Exception as e:
        if not fails:
            raise
        error = str(e)
    finally:
        query.stop()
    assert (error is not None) == fails, "the query did not fail"
    after = output_rows(spark, output)
    assert len(set(after)) == len(after), "a row was written twice"
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    return Run(sorted(set(after) - set(before)), sizes, error)


def output_rows(spark, output: Path) -> list[tuple]:
    if not output.exists():
        return []
    rows = spark.read.schema(arrow.DDL).parquet(str(output)).select("topic", "partition", "offset", "value").collect()
    return [(r.topic, r.partition, r.offset, None if r.value is None else bytes(r.value)) for r in rows]


def offsets_log(checkpoint: Path) -> list[dict]:
    """The source offsets of each micro-batch, as Spark wrote them to the checkpoint."""
    files = sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))
    return [json.loads(f.read_text().splitlines()[-1]) for f in files]


def values(rows: list[tuple]) -> list[bytes]:
    return sorted(row[3] for row in rows)


def expected(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i:04d}".encode() for i in range(count)]


def produce(root: kl.Root, topic: str, prefix: str, count: int, partition: int = 0) -> None:
    write(root, topic, expected(prefix, count), partition=partition)


def ends(root: kl.Root, topic: str, partition: int = 0) -> list[int]:
    """The offset of each message of a partition, then the log end."""
    return [m.offset for m in read_all(root, topic, partition)] + [root.log(topic, partition).state().log_end_offset]


# ----------------------------------------------------------------- through Spark


def test_available_now_reads_everything_once_and_resumes_from_the_checkpoint(spark, root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", "a", 30, partition=0)
    produce(root, "t", "b", 20, partition=1)
    checkpoint = tmp_path / "checkpoint"

    first = run(spark, root, checkpoint, topics="t", startingOffsets="earliest")
    assert values(first.rows) == expected("a", 30) + expected("b", 20)
    assert [offset for _, p, offset, _ in first.rows if p == 0] == ends(root, "t", 0)[:-1]
    assert offsets_log(checkpoint) == [
        {"t": {"id": root.topic_id("t"), "0": ends(root, "t", 0)[-1], "1": ends(root, "t", 1)[-1]}}
    ]

    produce(root, "t", "c", 7, partition=0)
    produce(root, "t", "d", 5, partition=1)
    second = run(spark, root, checkpoint, topics="t", startingOffsets="earliest")
    assert values(second.rows) == expected("c", 7) + expected("d", 5)

    assert run(spark, root, checkpoint, topics="t").rows == []


@limits
def test_max_offsets_per_trigger_spreads_over_partitions_by_lag(spark, root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", "a", 12, partition=0)
    produce(root, "t", "b", 4, partition=1)
    checkpoint = tmp_path / "checkpoint"

    got = run(spark, root, checkpoint, topics="t", startingOffsets="earliest", maxOffsetsPerTrigger="4")

    assert got.sizes == [4, 4, 4, 4]
    a, b = ends(root, "t", 0), ends(root, "t", 1)
    i = root.topic_id("t")
    assert offsets_log(checkpoint) == [{"t": {"id": i, "0": a[3 * n], "1": b[n]}} for n in range(1, 5)]
    assert values(got.rows) == expected("a", 12) + expected("b", 4)


@limits
def test_max_bytes_per_trigger_cuts_at_message_boundaries(spark, root, tmp_path):
    root.create_topic("t")
    produce(root, "t", "m", 10)
    size = read_all(root, "t")[0].next_offset

    got = run(spark, root, tmp_path / "checkpoint", topics="t", startingOffsets="earliest", maxBytesPerTrigger=str(3 * size + 5))

    assert got.sizes == [3, 3, 3, 1]
    assert values(got.rows) == expected("m", 10)


@limits
def test_trigger_once_ignores_the_caps(spark, root, tmp_path):
    root.create_topic("t")
    produce(root, "t", "m", 10)
    options = {"topics": "t", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "3"}
    assert run(spark, root, tmp_path / "checkpoint", once=True, **options).sizes == [10]


@limits
def test_a_run_that_failed_midway_is_finished_by_the_next_each_message_once(spark, root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", "a", 9, partition=0)
    produce(root, "t", "b", 3, partition=1)
    checkpoint = tmp_path / "checkpoint"
    options = {"topics": "t", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "4"}
    damaged = ends(root, "t", 0)[5] - 1  # the last byte of message 4, read by the second batch
    flip_byte(active_segment(root, "t", 0), damaged)

    first = run(spark, root, checkpoint, fails=True, **options)
    assert "CorruptMessage" in first.error
    assert first.sizes == [4]
    flip_byte(active_segment(root, "t", 0), damaged)
    produce(root, "t", "c", 2, partition=1)
    second = run(spark, root, checkpoint, **options)

    assert values(first.rows + second.rows) == expected("a", 9) + expected("b", 3) + expected("c", 2)


@pytest.mark.parametrize("cap", [pytest.param("2", marks=limits), None])
def test_available_now_stops_at_the_end_found_when_it_started(spark, root, tmp_path, cap):
    root.create_topic("t")
    produce(root, "t", "a", 6)
    checkpoint = tmp_path / "checkpoint"
    capped = {"maxOffsetsPerTrigger": cap} if cap else {}

    def more(query) -> None:
        """Produce once the first micro-batch is done (or the query is)."""
        while query.isActive and not query.recentProgress:
            time.sleep(0.05)
        produce(root, "t", "late", 2)

    first = run(spark, root, checkpoint, during=more, topics="t", startingOffsets="earliest", **capped)
    assert first.sizes == ([2, 2, 2] if cap else [6])
    assert values(first.rows) == expected("a", 6)
    assert values(run(spark, root, checkpoint, topics="t").rows) == expected("late", 2)


def test_a_running_stream_reads_new_messages_as_they_arrive(spark, root, tmp_path):
    root.create_topic("t")
    produce(root, "t", "a", 4)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = spark.readStream.format("kl").option("root", str(root.path)).option("topics", "t").option("startingOffsets", "earliest")
    query = df.load().writeStream.format("parquet").option("path", str(output)).option("checkpointLocation", str(checkpoint))
    query = query.trigger(processingTime="100 milliseconds").start()
    try:
        for want, more in ((4, "b"), (7, None)):
            deadline = time.monotonic() + 60
            while sum(p["numInputRows"] for p in query.recentProgress) < want and time.monotonic() < deadline:
                assert query.isActive, query.exception()
                time.sleep(0.1)
            if more:
                produce(root, "t", more, 3)
    finally:
        query.stop()
    assert values(output_rows(spark, output)) == expected("a", 4) + expected("b", 3)


def test_a_stream_starts_at_latest_and_a_topic_matching_later_is_read_from_its_start(spark, root, tmp_path):
    root.create_topic("ev-a")
    root.create_topic("other")
    produce(root, "ev-a", "a", 3)
    checkpoint = tmp_path / "checkpoint"
    assert run(spark, root, checkpoint, topicPattern="ev-.*").rows == []

    root.create_topic("ev-b", kl.TopicConfig(partitions=2))
    produce(root, "ev-b", "b", 4, partition=1)
    produce(root, "ev-a", "c", 2)
    produce(root, "other", "x", 2)
    got = run(spark, root, checkpoint, topicPattern="ev-.*")
    assert values(got.rows) == expected("b", 4) + expected("c", 2)
    assert {(row[0], row[1]) for row in got.rows} == {("ev-a", 0), ("ev-b", 1)}


def rolled(root: kl.Root) -> None:
    root.create_topic("t", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512))


def test_data_deleted_by_retention_fails_the_stream_or_is_skipped(spark, root, tmp_path):
    rolled(root)
    produce(root, "t", "a", 5)
    checkpoint = tmp_path / "checkpoint"
    assert values(run(spark, root, checkpoint, topics="t", startingOffsets="earliest").rows) == expected("a", 5)
    for i in range(40):
        produce(root, "t", f"b{i:02d}-", 1)
    read_from = read_all(root, "t")[5].offset
    retain(root.log("t", 0), max_age_ms=0, max_bytes=1, delete_delay=0)
    first = root.log("t", 0).state().log_start_offset
    assert first > read_from

    failed = run(spark, root, checkpoint, fails=True, topics="t")
    assert f"data loss: topic 't' partition 0 offsets {read_from} to {first} were deleted by retention" in failed.error

    kept = [m.value for m in read_all(root, "t")]
    assert values(run(spark, root, checkpoint, topics="t", failOnDataLoss="false").rows) == sorted(kept)


def test_bad_options_fail_the_query_with_one_clear_line(spark, root, tmp_path):
    root.create_topic("t")
    failed = run(spark, root, tmp_path / "c1", fails=True, topics="t", endingOffsets="latest")
    assert "InvalidConfig: endingOffsets is for batch reads (spark.read); a stream reads on as data arrives" in failed.error
    if not stream.ADMISSION_CONTROL:
        failed = run(spark, root, tmp_path / "c2", fails=True, topics="t", maxOffsetsPerTrigger="5")
        assert "maxOffsetsPerTrigger needs pyspark 4.2 or newer" in failed.error
    with pytest.raises(InvalidConfig, match=r"maxOffsetsPerTrigger must be a whole number >= 0, not '-1'"):
        reader(root, topics="t", maxOffsetsPerTrigger="-1")
    with pytest.raises(kl.TopicNotFound, match="topic 'nope' does not exist"):
        reader(root, topics="nope").initialOffset()


def recreate(root: kl.Root, topic: str, partitions: int = 1) -> None:
    root.delete_topic(topic)
    root.create_topic(topic, kl.TopicConfig(partitions=partitions))


RECREATED = "TopicRecreated: topic ev was deleted and created again since this checkpoint"


def test_a_recreated_topic_fails_the_stream_or_with_on_recreated_restart_is_read_from_its_start(spark, root, tmp_path):
    root.create_topic("ev", kl.TopicConfig(partitions=2))
    for p in (0, 1):
        produce(root, "ev", f"m{p}-", 3, partition=p)
    checkpoint = tmp_path / "checkpoint"
    assert len(run(spark, root, checkpoint, topics="ev", startingOffsets="earliest").rows) == 6
    old_id = root.topic_id("ev")
    recreate(root, "ev", partitions=2)
    for p in (0, 1):
        produce(root, "ev", f"n{p}-", 6, partition=p)  # the same message size: the old offsets are message starts

    failed = run(spark, root, checkpoint, fails=True, topics="ev")
    assert f"{RECREATED} (its topic id was {old_id}, it is {root.topic_id('ev')} now): start a new checkpoint" in failed.error
    assert "InvalidOffset" not in failed.error
    again = run(spark, root, checkpoint, topics="ev", onRecreated="restart")
    assert values(again.rows) == expected("n0-", 6) + expected("n1-", 6)
    assert offsets_log(checkpoint)[-1]["ev"] == {
        "id": root.topic_id("ev"),
        "0": ends(root, "ev", 0)[-1],
        "1": ends(root, "ev", 1)[-1],
    }
    assert run(spark, root, checkpoint, topics="ev").rows == []


def test_a_recreated_topic_where_the_old_offset_is_inside_a_message_fails_naming_the_recreation(spark, root, tmp_path):
    root.create_topic("ev")
    write(root, "ev", [b"m000", b"m001", b"m002"])
    checkpoint = tmp_path / "checkpoint"
    run(spark, root, checkpoint, topics="ev", startingOffsets="earliest")
    old_end = root.log("ev", 0).state().log_end_offset
    recreate(root, "ev")
    write(root, "ev", [b"n%03d-longer-than-before" % i for i in range(6)])
    assert old_end not in ends(root, "ev")

    failed = run(spark, root, checkpoint, fails=True, topics="ev")
    assert RECREATED in failed.error and "InvalidOffset" not in failed.error
    assert len(run(spark, root, checkpoint, topics="ev", onRecreated="restart").rows) == 6


# ----------------------------------------------------------------- the reader, called as Spark calls it


def test_offsets_are_next_byte_offsets_by_topic_and_partition_with_the_topic_id(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", "a", 3, partition=1)
    end = root.log("t", 1).state().log_end_offset
    i = root.topic_id("t")
    assert reader(root, topics="t", startingOffsets="earliest").initialOffset() == {"t": {"id": i, "0": 0, "1": 0}}
    assert reader(root, topics="t").initialOffset() == {"t": {"id": i, "0": 0, "1": end}}
    assert reader(root, topics="t").reportLatestOffset() == {"t": {"id": i, "0": 0, "1": end}}
    second = read_all(root, "t", 1)[1].offset
    starting = f'{{"t": {{"1": {second}}}}}'
    assert reader(root, topics="t", startingOffsets=starting).initialOffset() == {"t": {"id": i, "0": 0, "1": second}}


@limits
def test_latest_offset_keeps_partitions_no_longer_read_and_fixes_the_available_now_end(root):
    root.create_topic("t")
    produce(root, "t", "a", 3)
    i = root.topic_id("t")
    source = reader(root, topicPattern="t")
    source.prepareForTriggerAvailableNow()
    target = root.log("t", 0).state().log_end_offset
    produce(root, "t", "b", 3)
    start = {"t": {"0": 0}, "gone": {"0": 77}}  # without ids: as a kl before topic ids wrote them
    assert source.latestOffset(start, stream.ReadAllAvailable()) == {"t": {"0": target, "id": i}, "gone": {"0": 77}}
    assert source.latestOffset({"t": {"id": i, "0": target}}, source.getDefaultReadLimit()) == {"t": {"id": i, "0": target}}
    later = root.log("t", 0).state().log_end_offset  # a start found after the end was fixed
    assert source.latestOffset({"t": {"0": later}}, stream.ReadAllAvailable()) == {"t": {"0": later, "id": i}}
    with pytest.raises(InvalidConfig, match=rf"^t/0: the stream's offset {later + 1} is past the log end {later} "):
        source.latestOffset({"t": {"0": later + 1}}, stream.ReadAllAvailable())


@limits
def test_caps_are_shared_by_lag_and_a_partition_with_lag_gets_at_least_one_message(root):
    root.create_topic("t", kl.TopicConfig(partitions=3))
    produce(root, "t", "a", 30, partition=0)
    produce(root, "t", "b", 1, partition=1)
    offsets = {p: [m.offset for m in read_all(root, "t", p)] + [root.log("t", p).state().log_end_offset] for p in (0, 1)}
    start = {"t": {"0": 0, "1": 0, "2": 0}}

    capped = reader(root, topics="t", maxOffsetsPerTrigger="10")
    assert capped.getDefaultReadLimit() == stream.ReadMaxRows(10)
    i = root.topic_id("t")
    assert capped.latestOffset(start, capped.getDefaultReadLimit()) == {
        "t": {"0": offsets[0][9], "1": offsets[1][1], "2": 0, "id": i}
    }
    assert capped.latestOffset(start, stream.ReadAllAvailable()) == {
        "t": {"0": offsets[0][30], "1": offsets[1][1], "2": 0, "id": i}
    }

    size = offsets[0][1]
    both = reader(root, topics="t", maxOffsetsPerTrigger="10", maxBytesPerTrigger=str(6 * size))
    assert both.latestOffset(start, both.getDefaultReadLimit()) == {
        "t": {"0": offsets[0][5], "1": offsets[1][1], "2": 0, "id": i}
    }
    by_bytes = reader(root, topics="t", maxBytesPerTrigger=str(6 * size))
    assert by_bytes.getDefaultReadLimit() == stream.ReadMaxBytes(6 * size)
    assert by_bytes.latestOffset(start, by_bytes.getDefaultReadLimit()) == {
        "t": {"0": offsets[0][5], "1": offsets[1][1], "2": 0, "id": i}
    }


def test_starting_timestamp_gives_each_partition_its_first_message_at_or_after_it(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write(root, "t", [b"old"], partition=0, timestamp=1_000)
    new = write(root, "t", [b"new"], partition=0, timestamp=5_000)[0].offset
    write(root, "t", [b"old"], partition=1, timestamp=1_000)
    end = root.log("t", 1).state().log_end_offset
    assert reader(root, topics="t", startingTimestamp="3000").initialOffset() == {
        "t": {"id": root.topic_id("t"), "0": new, "1": end}
    }


def test_older_pyspark_gets_the_ends_and_refuses_the_caps(root, monkeypatch):
    root.create_topic("t")
    produce(root, "t", "a", 3)
    assert reader(root, topics="t").latestOffset() == {
        "t": {"id": root.topic_id("t"), "0": root.log("t", 0).state().log_end_offset}
    }
    monkeypatch.setattr(stream, "ADMISSION_CONTROL", False)
    monkeypatch.setattr(stream.pyspark, "__version__", "4.1.0")
    with pytest.raises(stream.PysparkTooOld, match=r"^maxBytesPerTrigger needs pyspark 4.2 or newer; this is pyspark 4.1.0$"):
        reader(root, topics="t", maxBytesPerTrigger="1000")
    assert reader(root, topics="t").options.max_offsets_per_trigger == 0


def test_partitions_are_split_and_skip_what_retention_deleted(root):
    rolled(root)
    for i in range(40):
        produce(root, "t", f"m{i:02d}-", 1)
    end = {"t": {"0": root.log("t", 0).state().log_end_offset}}
    pieces = reader(root, topics="t", minPartitions="4").partitions({"t": {"0": 0}}, end)
    assert len(pieces) >= 4
    assert [p.range.start for p in pieces][0] == 0 and pieces[-1].range.end == end["t"]["0"]
    assert all(a.range.end == b.range.start for a, b in zip(pieces, pieces[1:], strict=False))

    retain(root.log("t", 0), max_age_ms=0, max_bytes=1, delete_delay=0)
    first = root.log("t", 0).state().log_start_offset
    with pytest.raises(DataLoss, match=rf"offsets 0 to {first} were deleted"):
        reader(root, topics="t").partitions({"t": {"0": 0}}, end)
    (piece,) = reader(root, topics="t", failOnDataLoss="false").partitions({"t": {"0": 0}}, end)
    assert piece.range == (("t", 0, first, end["t"]["0"]))
    assert reader(root, topics="t").partitions(end, end) == []


def test_batch_only_options_are_refused(root):
    root.create_topic("t")
    for option in ("endingOffsets", "endingTimestamp", "ranges"):
        with pytest.raises(InvalidConfig, match=f"^{option} is for batch reads"):
            reader(root, topics="t", **{option.lower(): "1"})


def test_offsets_of_another_creation_fail_or_restart_at_the_new_start_and_old_offsets_count_as_current(root):
    root.create_topic("ev", kl.TopicConfig(partitions=2))
    produce(root, "ev", "m", 3)
    old = reader(root, topics="ev").latestOffset()
    recreate(root, "ev")
    produce(root, "ev", "n", 6)
    new = {"id": root.topic_id("ev"), "0": root.log("ev", 0).state().log_end_offset}
    with pytest.raises(
        TopicRecreated,
        match=rf"^topic ev was deleted and created again since this checkpoint \(its topic id was {old['ev']['id']}, ",
    ):
        reader(root, topics="ev").latestOffset(old, stream.ReadAllAvailable())
    restarting = reader(root, topics="ev", onRecreated="restart")
    assert restarting.latestOffset(old, stream.ReadAllAvailable()) == {"ev": new}  # the old partition 1 is gone
    (piece,) = restarting.partitions(old, {"ev": new})
    assert piece.range == ("ev", 0, 0, new["0"])
    with pytest.raises(TopicRecreated):  # pyspark before 4.2 gives latestOffset no start: partitions meets it
        reader(root, topics="ev").partitions(old, {"ev": new})
    # A batch planned before the topic was created again: it fails, or with restart is left out.
    with pytest.raises(TopicRecreated):
        reader(root, topics="ev").partitions({"ev": {**old["ev"], "0": 0}}, old)
    assert restarting.partitions({"ev": {**old["ev"], "0": 0}}, old) == []
    # Offsets without an id, written before topic ids: the current creation's.
    without = {"ev": {"0": new["0"]}}
    assert reader(root, topics="ev").latestOffset(without, stream.ReadAllAvailable()) == {"ev": {"0": new["0"], "id": new["id"]}}
    with pytest.raises(InvalidConfig, match=r"^the checkpoint's offset 'x' is not a byte offset"):
        reader(root, topics="ev").latestOffset({"ev": {"id": new["id"], "0": "x"}}, stream.ReadAllAvailable())
    with pytest.raises(InvalidConfig, match=r"^onRecreated must be fail or restart, not 'maybe'$"):
        reader(root, topics="ev", onRecreated="maybe")


def test_available_now_fixed_before_the_topic_was_created_again_fails_or_takes_the_new_end(root):
    root.create_topic("ev")
    produce(root, "ev", "m", 3)
    start = reader(root, topics="ev").latestOffset()
    for option, outcome in (("fail", None), ("restart", 6)):
        source = reader(root, topics="ev", onRecreated=option)
        source.prepareForTriggerAvailableNow()
        recreate(root, "ev")
        produce(root, "ev", "n", 6)
        if outcome is None:
            with pytest.raises(TopicRecreated):
                source.latestOffset(start, stream.ReadAllAvailable())
        else:
            end = source.latestOffset(start, stream.ReadAllAvailable())
            assert end == {"ev": {"id": root.topic_id("ev"), "0": ends(root, "ev")[-1]}}


def test_a_stream_with_include_headers_writes_the_headers_column(spark, root, tmp_path):
    root.create_topic("h")
    kl.Producer(root).send_batch("h", [b"a", None], headers=[[("k", b"v"), ("n", None)], None], partition=0)
    run(spark, root, tmp_path / "cp", topics="h", startingOffsets="earliest", includeHeaders="true")
    written = spark.read.parquet(str(tmp_path / "cp-out")).orderBy("offset").collect()
    assert [(r.value, None if r.headers is None else [(h.key, h.value) for h in r.headers]) for r in written] == [
        (b"a", [("k", b"v"), ("n", None)]), (None, None),
    ]
