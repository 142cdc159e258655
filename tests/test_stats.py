"""A root's figures from its files (``kl.stats``): the snapshot and the Prometheus
collector's gauges against what real producers and group members did, and scrapes that
meet bad files (a deleted topic, a damaged offset file, a topic created again, a damaged
partition state, a root gone) and still answer."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import kafka
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import kl
from kl import stats
from kl.groups import Status
from kl.registry import Registry

from conftest import write, write_each

KL = [sys.executable, "-m", "kl_cli"]
HOUR = 3_600_000
MEMBER = """
import sys, kl
member = kl.GroupConsumer(sys.argv[1], sys.argv[2], [sys.argv[3]], auto_commit=False, poll_interval=0.1)
taken = sum(len(batch.messages) for batch in member.batches(max_messages=int(sys.argv[4])))
member.commit()
print(taken, flush=True)
sys.stdin.read()
member.close()
"""
PRODUCED = [10, 7, 5]
"""Records of orders' partitions: one ``kl produce`` process, a gzip batch, single sends."""
CONSUMED = 9


def scrape(collector: stats.Collector) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The collector's exposition, parsed: metric name -> {sorted labels: value}."""
    registry = CollectorRegistry()
    registry.register(collector)
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def labels(**given: object) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in given.items()))


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory):
    """Topic orders (3 partitions) written by real producers; group shop: a live member
    (a child process) that consumed and committed ``CONSUMED`` records; group late:
    committed after the first 2 of partition 2's records, stamped an hour ago."""
    root = kl.Root(tmp_path_factory.mktemp("stats") / "root")
    root.create_topic("orders", kl.TopicConfig(partitions=3))
    root.create_topic("other")
    lines = "".join(f"order {i}\n" for i in range(PRODUCED[0]))
    subprocess.run([*KL, "--root", root.path, "produce", "orders", "-p", "0"], input=lines, text=True, check=True)
    write(root, "orders", [b"gz %d" % i for i in range(PRODUCED[1])], partition=1, compression="gzip")
    offsets = write_each(root, "orders", [b"one %d" % i for i in range(PRODUCED[2])], partition=2, timestamp=now_ms() - HOUR)
    write_each(root, "other", [b"x"])
    Registry(root.path, "late").write_offset("orders", 2, offsets[2], "test", root.topic_id("orders"))
    member = subprocess.Popen(
        [sys.executable, "-c", MEMBER, root.path, "shop", "orders", str(CONSUMED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert member.stdout is not None and int(member.stdout.readline()) == CONSUMED
    yield root
    member.communicate("")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_the_snapshot_counts_what_the_producers_wrote_and_the_members_consumed(busy):
    snap = stats.snapshot(busy)
    assert snap.topics == {"orders": 3, "other": 1} and (snap.skipped, snap.unreadable) == (0, 0)
    orders = [p for p in snap.partitions if p.topic == "orders"]
    assert [(p.log_start_kafka_offset, p.log_end_kafka_offset) for p in orders] == [(0, n) for n in PRODUCED]
    for p in orders:
        log = busy.log("orders", p.partition)
        assert (p.log_start_offset, p.log_end_offset, p.size_in_bytes) == (0, log.log_end_offset, log.size_in_bytes())
        assert p.segments == 1
    shop, late = (next(g for g in snap.groups if g.group == name) for name in ("shop", "late"))
    assert len(shop.members) == 1 and late.members == []
    rows = [r for r in shop.partitions if r.topic == "orders"]
    assert sum(r.committed_kafka_offset or 0 for r in rows) == CONSUMED
    assert sum(r.lag_messages for r in rows) == sum(PRODUCED) - CONSUMED
    for r in rows:
        if r.committed is not None:
            assert r.committed_kafka_offset + r.lag_messages == PRODUCED[r.partition] == r.log_end_kafka_offset
    [late_row] = [r for r in late.partitions if r.committed is not None]
    assert (late_row.partition, late_row.committed_kafka_offset, late_row.lag_messages) == (2, 2, 3)
    assert HOUR <= late_row.lag_ms < 2 * HOUR


def test_the_gauges_are_named_and_valued_as_kafka_exporter_gives_them(busy):
    found = scrape(stats.Collector(busy))
    assert found["kafka_topic_partitions"] == {labels(topic="orders"): 3, labels(topic="other"): 1}
    current = found["kafka_topic_partition_current_offset"]
    assert [current[labels(topic="orders", partition=p)] for p in range(3)] == PRODUCED
    assert found["kafka_topic_partition_oldest_offset"][labels(topic="orders", partition=1)] == 0
    end_bytes = found["kl_topic_partition_log_end_offset_bytes"]
    for p in range(3):
        assert end_bytes[labels(topic="orders", partition=p)] == busy.log("orders", p).log_end_offset
        assert (
            found["kl_topic_partition_size_bytes"][labels(topic="orders", partition=p)]
            == end_bytes[labels(topic="orders", partition=p)]
        )
    assert found["kl_topic_partition_log_start_offset_bytes"][labels(topic="orders", partition=0)] == 0
    lag, committed = found["kafka_consumergroup_lag"], found["kafka_consumergroup_current_offset"]
    shop = {k: v for k, v in lag.items() if ("consumergroup", "shop") in k}
    assert sum(shop.values()) == sum(PRODUCED) - CONSUMED
    assert found["kafka_consumergroup_lag_sum"][labels(consumergroup="shop", topic="orders")] == sum(PRODUCED) - CONSUMED
    for key, value in shop.items():
        partition = int(dict(key)["partition"])
        assert committed[key] + value == PRODUCED[partition]
    late = labels(consumergroup="late", topic="orders", partition=2)
    assert (committed[late], lag[late]) == (2, 3)
    assert (
        found["kl_consumergroup_lag_bytes"][late]
        == busy.log("orders", 2).log_end_offset - found["kl_consumergroup_current_offset_bytes"][late]
    )
    assert 3600 <= found["kl_consumergroup_lag_seconds"][late] < 7200
    assert found["kafka_consumergroup_members"] == {labels(consumergroup="shop"): 1, labels(consumergroup="late"): 0}
    assert found["kl_stats_partitions_skipped"] == {labels(reason="time budget"): 0, labels(reason="unreadable"): 0}
    assert found["kl_stats_scrape_seconds"][()] > 0


def test_the_topic_filter_leaves_out_the_other_topics_and_the_groups_lag_on_them(busy):
    Registry(busy.path, "late").write_offset("other", 0, 0, "test", busy.topic_id("other"))
    try:
        found = scrape(stats.Collector(busy, topics=lambda topic: topic == "orders"))
        assert found["kafka_topic_partitions"] == {labels(topic="orders"): 3}
        assert {dict(k)["topic"] for k in found["kafka_consumergroup_lag"]} == {"orders"}
        assert (
            scrape(stats.Collector(busy))["kafka_consumergroup_lag"][labels(consumergroup="late", topic="other", partition=0)]
            == 1
        )
    finally:
        Registry(busy.path, "late").forget_offsets("other", [0], "test")


def test_a_budget_spent_gives_what_it_had_no_time_for_as_last_read_and_the_next_scrape_goes_on(root):
    root.create_topic("t", kl.TopicConfig(partitions=4))
    for p in range(4):
        write_each(root, "t", [b"m"] * (p + 1), partition=p)
    for group in "abc":
        Registry(root.path, group).write_offset("t", 0, 0, "test", root.topic_id("t"))
    cursor = stats.Cursor()
    first = stats.snapshot(root, cursor=cursor)
    [more] = write_each(root, "t", [b"more"], partition=0)
    for group in "abc":
        Registry(root.path, group).write_offset("t", 0, more, "test", root.topic_id("t"))
    spent = stats.snapshot(root, budget=0, cursor=cursor)  # no time: one partition and one group read, the rest as they were
    assert (spent.skipped, [p.log_end_kafka_offset for p in spent.partitions]) == (3, [2, 2, 3, 4])
    assert (spent.groups_skipped, [lag_of(g) for g in spent.groups]) == (2, [(1, 1), (0, 1), (0, 1)])
    assert cursor.after == ("t", 0)
    again = stats.snapshot(root, budget=0, cursor=cursor)
    assert cursor.after == ("t", 1) and again.partitions == spent.partitions
    assert [lag_of(g) for g in again.groups] == [(1, 1), (1, 1), (0, 1)]
    assert [p.log_end_kafka_offset for p in first.partitions] == [1, 2, 3, 4]
    found = scrape(stats.Collector(root, budget=0))
    assert found["kl_stats_groups_skipped"][()] == 0  # every group is described once, whatever the budget
    assert len(found["kafka_consumergroup_lag"]) == 3


def lag_of(info) -> tuple[int, int]:
    """The committed Kafka offset and the lag of partition 0 of topic t."""
    row = next(r for r in info.partitions if r.partition == 0)
    return row.committed_kafka_offset, row.lag_messages


def test_snapshots_again_follow_the_commits_and_the_appends(root):
    root.create_topic("t")
    offsets = write_each(root, "t", [b"m%d" % i for i in range(5)])
    registry = Registry(root.path, "g")
    registry.write_offset("t", 0, offsets[1], "test", root.topic_id("t"))
    cursor = stats.Cursor()
    lags = []
    for more, at in ((2, 3), (1, 3), (1, 7)):
        [row] = stats.snapshot(root, cursor=cursor).groups[0].partitions
        lags.append((row.committed_kafka_offset, row.lag_messages, row.log_end_kafka_offset))
        offsets += write_each(root, "t", [b"n"] * more)
        registry.write_offset("t", 0, offsets[at], "test", root.topic_id("t"))
    [row] = stats.snapshot(root, cursor=cursor).groups[0].partitions
    lags.append((row.committed_kafka_offset, row.lag_messages, row.log_end_kafka_offset))
    assert lags == [(1, 4, 5), (3, 4, 7), (3, 5, 8), (7, 2, 9)]


def test_a_kafka_clients_group_commits_into_the_group_files_the_snapshot_reads(root, served):
    """Kafka consumer groups coordinated by kl serve --kafka commit into kl's group files."""
    root.create_topic("k")
    write_each(root, "k", [b"r%d" % i for i in range(6)])
    running, _ = served()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{running.address[1]}", group_id="kgroup", enable_auto_commit=False, api_version=(2, 5)
    )
    try:
        tp = kafka.TopicPartition("k", 0)
        consumer.assign([tp])
        consumer.commit({tp: kafka.OffsetAndMetadata(4, "", -1)})
    finally:
        consumer.close()
    [row] = next(g for g in stats.snapshot(root).groups if g.group == "kgroup").partitions
    assert (row.committed_kafka_offset, row.lag_messages, row.status) == (4, 2, Status.OK)


def test_a_scrape_meets_bad_files_and_still_answers(root, caplog):
    root.create_topic("gone")
    root.create_topic("again", kl.TopicConfig(partitions=2))
    root.create_topic("t", kl.TopicConfig(partitions=2))
    root.create_topic("broken", kl.TopicConfig(partitions=2))
    for topic in ("gone", "again", "t", "broken"):
        write_each(root, topic, [b"a", b"b", b"c"])
    write_each(root, "t", [b"d", b"e"], partition=1)
    old_id = root.topic_id("again")
    Registry(root.path, "g").write_offset("gone", 0, 0, "test", root.topic_id("gone"))
    collector = stats.Collector(root)
    assert scrape(collector)["kafka_topic_partition_current_offset"][labels(topic="again", partition=0)] == 3

    root.delete_topic("gone")
    root.delete_topic("again")
    root.create_topic("again")
    write_each(root, "again", [b"new"])
    registry = Registry(root.path, "g")
    registry.write_offset("again", 0, 0, "before", old_id)  # a member of the old creation commits meanwhile
    body = b"offset 9\nmember test\ntime 2023-11-14T22:13:20.000Z\n"
    damaged = Path(root.path, ".groups", "g", "offsets", "t", "0")  # as an older kl kept offsets
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(body + b"crc32 %08x\n" % (zlib.crc32(body) ^ 1))
    registry.write_offset("t", 1, 0, "test", root.topic_id("t"))
    for p in range(2):
        Registry(root.path, "h").write_offset("broken", p, 0, "test", root.topic_id("broken"))
    Path(root.path, "broken", "1", "state").write_bytes(b"not a state record")

    with caplog.at_level(logging.WARNING, logger="kl.stats"):
        found = scrape(collector)
    assert found["kafka_topic_partitions"] == {labels(topic="again"): 1, labels(topic="t"): 2, labels(topic="broken"): 2}
    current = found["kafka_topic_partition_current_offset"]
    assert current[labels(topic="again", partition=0)] == 1 and labels(topic="again", partition=1) not in current
    assert labels(topic="broken", partition=1) not in current and current[labels(topic="broken", partition=0)] == 3
    assert found["kl_stats_partitions_skipped"][labels(reason="unreadable")] == 1
    assert [r.getMessage() for r in caplog.records if "broken/1" in r.getMessage()] != []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kl.stats"):
        assert scrape(collector)["kl_stats_partitions_skipped"][labels(reason="unreadable")] == 1
    assert caplog.records == []  # warned once, while it stays so
    lag = found.get("kafka_consumergroup_lag", {})
    assert {k: v for k, v in lag.items() if ("consumergroup", "g") in k} == {labels(consumergroup="g", topic="t", partition=1): 2}
    snap = stats.snapshot(root, groups=lambda g: g == "g")
    statuses = {(r.topic, r.partition): r.status for r in snap.groups[0].partitions}
    assert statuses[("t", 0)] is Status.DAMAGED and statuses[("again", 0)] is Status.STALE
    assert ("gone", 0) not in statuses
    assert lag[labels(consumergroup="h", topic="broken", partition=0)] == 3  # the group is read all the same
    assert labels(consumergroup="h", topic="broken", partition=1) not in lag
    described = subprocess.run([*KL, "--root", root.path, "groups", "describe", "h"], capture_output=True, text=True)
    assert "unreadable partition: partition state" in described.stdout
    assert (described.returncode, described.stderr) == (
        1,
        "Error: group h: unreadable partition state of broken/1: run 'kl recover'\n",
    )


def test_a_scrape_of_a_root_gone_gives_its_own_gauges_only(tmp_path):
    root = kl.Root(tmp_path / "root")
    root.create_topic("t")
    collector = stats.Collector(root)
    shutil.rmtree(root.path)
    found = scrape(collector)
    assert found["kl_stats_partitions_skipped"][labels(reason="unreadable")] == 1
    assert "kafka_topic_partitions" not in found and not os.path.exists(root.path)
