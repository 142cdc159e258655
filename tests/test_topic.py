"""Topics under a root: names, create, list, describe, delete, config."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import kl
from kl.log.config import CONFIG_FILE

from conftest import partition_dir, read_all, values_of, write, write_each

BAD_NAMES = ["", ".", "..", ".hidden", "../x", "a/b", "a\x00b", "x" * 250, "é", "/etc", "a b", "a\nb", "a:b",
             "a\\b", "..."]


# ----------------------------------------------------------------- names


@pytest.mark.parametrize("name", BAD_NAMES)
def test_validate_name_rejects(name):
    with pytest.raises(kl.InvalidTopicName, match="invalid topic name"):
        kl.validate_name(name)


@pytest.mark.parametrize("name", ["a", "A-Z_0.9", "x" * 249, "a..b", "a.", "-", "_", "0"])
def test_validate_name_accepts(name):
    assert kl.validate_name(name) == name


@pytest.mark.parametrize("name", [None, 1, b"bytes"])
def test_validate_name_rejects_non_strings(name):
    with pytest.raises(kl.InvalidTopicName):
        kl.validate_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_topic_rejects_bad_names(root, name):
    with pytest.raises(kl.InvalidTopicName):
        root.create_topic(name)
    assert not os.path.exists(root.path)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_every_use_of_a_bad_name_raises_invalid_topic_name(root, name):
    with pytest.raises(kl.InvalidTopicName):
        root.config(name)
    with pytest.raises(kl.InvalidTopicName):
        root.log(name, 0)
    with pytest.raises(kl.InvalidTopicName):
        root.describe(name)
    with pytest.raises(kl.InvalidTopicName):
        root.delete_topic(name)
    with pytest.raises(kl.InvalidTopicName):
        kl.Producer(root).send(name, b"x")
    with pytest.raises(kl.InvalidTopicName):
        kl.Consumer(root).fetch(name, 0, 0)


def test_a_249_character_name_works(root):
    name = "n" * 249
    root.create_topic(name)
    write_each(root, name, [b"long name"])
    assert root.topics() == [name]
    assert values_of(read_all(root, name)) == [b"long name"]


def test_a_name_that_climbs_out_of_the_root_touches_nothing(root, tmp_path):
    with pytest.raises(kl.InvalidTopicName):
        root.create_topic("../escaped")
    assert not (tmp_path / "escaped").exists()


def test_a_symlink_planted_as_a_topic_is_invalid_on_use(root, tmp_path):
    root.create_topic("real")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(root.path, "planted"))
    for use in (
        lambda: root.create_topic("planted"),
        lambda: root.config("planted"),
        lambda: root.log("planted", 0),
        lambda: root.describe("planted"),
        lambda: root.delete_topic("planted"),
        lambda: kl.Producer(root).send("planted", b"x"),
        lambda: kl.Consumer(root).fetch("planted", 0, 0),
    ):
        with pytest.raises(kl.InvalidTopicName):
            use()
    assert list(elsewhere.iterdir()) == []
    assert root.topics() == ["real"]


def test_a_symlink_to_a_real_topic_is_invalid_on_use(root):
    root.create_topic("real")
    write_each(root, "real", [b"x"])
    os.symlink(os.path.join(root.path, "real"), os.path.join(root.path, "alias"))
    fresh = kl.Root(root.path)
    with pytest.raises(kl.InvalidTopicName):
        fresh.config("alias")
    with pytest.raises(kl.InvalidTopicName):
        kl.Consumer(fresh).fetch("alias", 0, 0)
    with pytest.raises(kl.InvalidTopicName):
        kl.Producer(fresh).send("alias", b"y")
    assert values_of(read_all(root, "real")) == [b"x"]


def test_a_plain_file_where_a_topic_should_be_is_invalid(root):
    os.makedirs(root.path)
    with open(os.path.join(root.path, "file"), "w") as f:
        f.write("{}")
    with pytest.raises(kl.InvalidTopicName):
        root.config("file")
    with pytest.raises(kl.InvalidTopicName):
        root.create_topic("file")


def test_a_root_reached_through_a_symlink_works(tmp_path):
    real = tmp_path / "real"
    kl.Root(real).create_topic("t")
    os.symlink(real, tmp_path / "link")
    linked = kl.Root(tmp_path / "link")
    write_each(linked, "t", [b"via link"])
    assert values_of(read_all(kl.Root(real), "t")) == [b"via link"]


# ----------------------------------------------------------------- create, list, describe, delete


def test_create_makes_every_partition(root):
    config = root.create_topic("t", kl.TopicConfig(partitions=3))
    assert config.partitions == 3
    assert sorted(p.name for p in (partition_dir(root, "t").parent).iterdir()) == ["0", "1", "2", CONFIG_FILE]


def test_create_returns_the_default_config_with_a_new_topic_id_and_headers(root):
    config = root.create_topic("t")
    assert dataclasses.replace(config, topic_id="") == kl.TopicConfig(headers=True)
    assert len(config.topic_id) == 22
    assert root.config("t") == config


def test_create_writes_the_config_file(root):
    root.create_topic("t", kl.TopicConfig(partitions=2, segment_bytes=1 << 20, max_message_bytes=1 << 16))
    fields = json.loads((partition_dir(root, "t").parent / CONFIG_FILE).read_text())
    assert fields["partitions"] == 2
    assert fields["segment_bytes"] == 1 << 20
    assert fields["max_message_bytes"] == 1 << 16
    assert fields["headers"] is True
    assert kl.Root(root.path).config("t") == kl.TopicConfig(
        partitions=2, segment_bytes=1 << 20, max_message_bytes=1 << 16, headers=True, topic_id=fields["topic_id"]
    )


# ----------------------------------------------------------------- topic ids


def _without_id(path: Path) -> None:
    """Make ``topic.json`` look written by a kl before topic ids."""
    fields = json.loads(path.read_text())
    del fields["topic_id"]
    path.write_text(json.dumps(fields))


def test_a_topic_created_again_has_a_new_id(root):
    first = root.create_topic("t").topic_id
    root.delete_topic("t")
    assert root.create_topic("t").topic_id != first


def test_editing_the_config_keeps_the_id(root):
    created = root.create_topic("t")
    path = partition_dir(root, "t").parent / CONFIG_FILE
    fields = json.loads(path.read_text())
    fields["retention_ms"] = 1000
    path.write_text(json.dumps(fields))
    os.utime(path, (0, 0))
    assert root.topic_id("t") == created.topic_id
    assert kl.Root(root.path).config("t").retention_ms == 1000


def test_a_config_naming_an_explicit_id_keeps_it(root):
    assert root.create_topic("t", kl.TopicConfig(topic_id="A" * 22)).topic_id == "A" * 22


@pytest.mark.parametrize("bad", ['"short"', "7", "null", '"' + "!" * 22 + '"'])
def test_a_damaged_topic_id_makes_the_config_unreadable(root, bad):
    root.create_topic("t")
    path = partition_dir(root, "t").parent / CONFIG_FILE
    path.write_text(path.read_text().replace(f'"{root.config("t").topic_id}"', bad))
    with pytest.raises(kl.InvalidConfig, match="topic_id"):
        kl.Root(root.path).config("t")


def test_a_topic_of_an_older_kl_is_given_an_id_once(root):
    root.create_topic("t")
    path = partition_dir(root, "t").parent / CONFIG_FILE
    _without_id(path)
    given = kl.Root(root.path).config("t").topic_id
    assert len(given) == 22
    assert json.loads(path.read_text())["topic_id"] == given
    assert kl.Root(root.path).topic_id("t") == given


def _open_and_report_id(path: str, start: float, out: multiprocessing.Queue) -> None:
    while time.time() < start:
        pass
    out.put(kl.Root(path).config("t").topic_id)


def test_processes_opening_an_older_topic_at_once_agree_on_one_id(root):
    root.create_topic("t")
    path = partition_dir(root, "t").parent / CONFIG_FILE
    context = multiprocessing.get_context("fork")
    for _ in range(5):
        _without_id(path)
        out = context.Queue()
        start = time.time() + 0.3
        workers = [context.Process(target=_open_and_report_id, args=(root.path, start, out)) for _ in range(6)]
        for w in workers:
            w.start()
        ids = {out.get(timeout=30) for _ in workers}
        for w in workers:
            w.join()
        assert ids == {json.loads(path.read_text())["topic_id"]}


def test_an_older_topic_whose_config_cannot_be_written_reads_without_an_id(root, monkeypatch, caplog):
    root.create_topic("t")
    _without_id(partition_dir(root, "t").parent / CONFIG_FILE)

    def read_only(path: str, data: bytes) -> None:
        raise kl.StorageError(f"cannot write {path}: read-only file system")

    monkeypatch.setattr("kl.topic.write_atomic", read_only)
    assert kl.Root(root.path).config("t").topic_id == ""
    assert "has no topic id and none can be written" in caplog.text


def test_create_an_existing_topic_raises_topic_exists(root):
    root.create_topic("t")
    write_each(root, "t", [b"keep me"])
    with pytest.raises(kl.TopicExists, match="'t' already exists"):
        root.create_topic("t")
    with pytest.raises(kl.TopicExists):
        kl.Root(root.path).create_topic("t", kl.TopicConfig(partitions=5))
    assert values_of(read_all(root, "t")) == [b"keep me"]
    assert root.config("t").partitions == 1


def test_create_leaves_no_temporary_directories(root):
    root.create_topic("t")
    assert [n for n in os.listdir(root.path) if n not in (".locks", "t")] == []


def test_create_makes_the_root_if_missing(tmp_path):
    root = kl.Root(tmp_path / "a" / "b")
    root.create_topic("t")
    assert root.topics() == ["t"]


def test_list_is_sorted_and_skips_hidden_and_foreign_entries(root):
    for name in ["b", "a", "c.d"]:
        root.create_topic(name)
    os.makedirs(os.path.join(root.path, ".hidden"))
    os.makedirs(os.path.join(root.path, "with space"))
    open(os.path.join(root.path, "plainfile"), "w").close()
    os.symlink(os.path.join(root.path, "a"), os.path.join(root.path, "link"))
    assert root.topics() == ["a", "b", "c.d"]


def test_list_of_an_empty_root_is_empty(tmp_path):
    assert kl.Root(tmp_path).topics() == []
    assert kl.Root(tmp_path).strays() == []


def test_strays_name_every_entry_that_is_not_a_topic(root):
    root.create_topic("real")
    os.makedirs(os.path.join(root.path, "junk"))
    os.makedirs(os.path.join(root.path, "dir_config", "topic.json"))
    os.makedirs(os.path.join(root.path, "with space"))
    os.makedirs(os.path.join(root.path, ".hidden"))
    os.makedirs(os.path.join(root.path, ".deleting-0123"))
    open(os.path.join(root.path, "plainfile"), "w").close()
    os.symlink(os.path.join(root.path, "real"), os.path.join(root.path, "link"))
    assert root.topics() == ["real"]
    assert root.strays() == [
        ("dir_config", "topic.json is not a regular file"),
        ("junk", "no topic.json"),
        ("link", "a symbolic link"),
        ("plainfile", "not a directory"),
        ("with space", "not a valid topic name"),
    ]
    assert root.listing() == (root.topics(), root.strays())  # one listing of the root for both


def test_a_topic_with_a_damaged_config_is_still_a_topic(root):
    root.create_topic("t")
    Path(root.path, "t", "topic.json").write_text("{")
    assert (root.topics(), root.strays()) == (["t"], [])


@pytest.mark.parametrize("use", [
    lambda r: r.topics(), lambda r: r.strays(), lambda r: r.listing(), lambda r: r.remove_leftovers(), lambda r: r.config("t"),
    lambda r: r.log("t", 0), lambda r: r.describe("t"), lambda r: r.delete_topic("t"),
    lambda r: kl.Producer(r).send("t", b"x"), lambda r: kl.Consumer(r).fetch("t", 0, 0),
])
def test_a_missing_root_raises_root_not_found(tmp_path, use):
    root = kl.Root(tmp_path / "nothing")
    with pytest.raises(kl.RootNotFound, match=f"^root {tmp_path}/nothing does not exist \\(is it mounted\\?\\)$"):
        use(root)
    assert not os.path.exists(root.path)


@pytest.mark.parametrize("use", [lambda r: r.topics(), lambda r: r.config("t"), lambda r: r.log("t", 0)])
def test_a_root_that_is_a_file_raises_root_not_found(tmp_path, use):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(kl.RootNotFound, match=f"^root {tmp_path}/file is not a directory$"):
        use(kl.Root(tmp_path / "file"))


def age(path: str, seconds: float) -> None:
    """Set a directory's times ``seconds`` into the past (its ctime stays: see below)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_remove_leftovers_removes_old_creating_and_deleting_directories(root, monkeypatch):
    root.create_topic("t")
    for name in (".creating-aa", ".deleting-bb", ".deleting-new"):
        os.makedirs(os.path.join(root.path, name, "0"))
        Path(root.path, name, "0", "00000000000000000000.kl").write_bytes(b"x")
    os.makedirs(os.path.join(root.path, ".hidden"))
    later = time.time_ns() + 1000 * 10**9  # ctime cannot be set back: move the file system's clock instead
    monkeypatch.setattr(kl.topic, "file_time_ns", lambda directory: later)
    age(os.path.join(root.path, ".deleting-new"), -1000)  # changed just now, as far as the clock knows
    expected = [(".creating-aa", "left by an interrupted topic create"), (".deleting-bb", "left by an interrupted topic delete")]
    assert root.remove_leftovers(dry_run=True) == expected
    assert len(os.listdir(root.path)) == 5
    assert root.remove_leftovers() == expected
    assert sorted(os.listdir(root.path)) == [".deleting-new", ".hidden", "t"]
    assert root.remove_leftovers() == []
    assert root.topics() == ["t"]


def test_remove_leftovers_on_a_host_whose_clock_runs_an_hour_ahead_leaves_a_fresh_leftover(root, monkeypatch):
    os.makedirs(os.path.join(root.path, ".creating-cc"))  # a create under way on another host
    ahead = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: ahead)
    monkeypatch.setattr(time, "time_ns", lambda: int(ahead * 1e9))
    assert root.remove_leftovers() == []
    assert os.listdir(root.path) == [".creating-cc"]  # and no file of its own left behind


def test_remove_leftovers_never_touches_a_create_in_progress(root):
    os.makedirs(os.path.join(root.path, ".creating-cc"))
    age(os.path.join(root.path, ".creating-cc"), 3600)  # mtime old, but its ctime is now
    assert root.remove_leftovers() == []
    assert root.remove_leftovers(min_age=0) == [(".creating-cc", "left by an interrupted topic create")]
    assert os.listdir(root.path) == []


def test_describe_an_empty_topic(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    info = root.describe("t")
    assert info.name == "t"
    assert info.config.partitions == 2
    assert info.partitions == [kl.PartitionInfo(0, 1, 0, 0, 0), kl.PartitionInfo(1, 1, 0, 0, 0)]
    assert info.size_in_bytes == 0


def test_describe_counts_segments_offsets_and_bytes(root):
    root.create_topic("t", kl.TopicConfig(partitions=2, segment_bytes=128, max_message_bytes=128))
    write_each(root, "t", [b"%010d" % i for i in range(10)], partition=0)
    write_each(root, "t", [b"x"], partition=1)
    info = root.describe("t")
    assert info.partitions == [kl.PartitionInfo(0, 3, 0, 320, 320), kl.PartitionInfo(1, 1, 0, 23, 23)]
    assert info.size_in_bytes == 343


def test_describing_many_topics_reads_the_mount_table_once(root, monkeypatch):
    from kl.log import fsutil

    monkeypatch.setattr(fsutil, "_mounts", {})
    read = []
    monkeypatch.setattr(fsutil, "_mount_of", lambda path: read.append(path) or ("/", "ext4", set()))
    monkeypatch.setattr(fsutil, "MOUNT_RECHECK_SECONDS", 3600.0)
    for n in range(20):
        root.create_topic(f"t{n}", kl.TopicConfig(partitions=5))
    assert [len(root.describe(name).partitions) for name in root.topics()] == [5] * 20
    assert len(read) == 1  # 100 partitions on one filesystem: one look at the mount table


def test_the_mount_table_is_read_again_after_its_recheck_interval(tmp_path, monkeypatch):
    from kl.log import fsutil

    monkeypatch.setattr(fsutil, "_mounts", {})
    monkeypatch.setattr(fsutil, "MOUNT_RECHECK_SECONDS", 0.0)
    read = []
    monkeypatch.setattr(fsutil, "_mount_of", lambda path: read.append(path) or ("/", "nfs4", set()))
    assert fsutil.mount_of(str(tmp_path))[1] == "nfs4"
    assert fsutil.mount_of(str(tmp_path))[1] == "nfs4"
    assert read == [str(tmp_path)] * 2


def test_describe_a_missing_topic_raises_topic_not_found(root):
    os.makedirs(root.path)
    with pytest.raises(kl.TopicNotFound, match="'nope' does not exist"):
        root.describe("nope")


def test_delete_removes_the_topic(root):
    root.create_topic("t")
    write_each(root, "t", [b"x"])
    root.delete_topic("t")
    assert root.topics() == []
    assert not os.path.exists(os.path.join(root.path, "t"))
    with pytest.raises(kl.TopicNotFound):
        root.config("t")
    with pytest.raises(kl.TopicNotFound):
        kl.Consumer(root).fetch("t", 0, 0)


def test_delete_a_missing_topic_raises_topic_not_found(root):
    os.makedirs(root.path)
    with pytest.raises(kl.TopicNotFound):
        root.delete_topic("nope")


def test_delete_leaves_no_leftovers_but_lock_files(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write_each(root, "t", [b"x"])
    root.delete_topic("t")
    assert [n for n in os.listdir(root.path) if n != ".locks"] == []


def test_a_topic_can_be_recreated_after_delete(root):
    root.create_topic("t")
    write_each(root, "t", [b"old"])
    root.delete_topic("t")
    root.create_topic("t", kl.TopicConfig(partitions=2))
    assert root.config("t").partitions == 2
    write_each(root, "t", [b"new"])
    assert values_of(read_all(root, "t")) == [b"new"]


def test_a_producer_of_another_root_handle_fails_cleanly_after_delete(root):
    root.create_topic("t")
    other = kl.Root(root.path)
    write_each(other, "t", [b"before"])
    root.delete_topic("t")
    with pytest.raises(kl.TopicNotFound):
        write_each(other, "t", [b"after"])
    assert root.topics() == []


def test_a_producer_of_another_root_handle_writes_into_a_recreated_topic(root):
    root.create_topic("t")
    other = kl.Root(root.path)  # a long-lived producer in another process
    write_each(other, "t", [b"before"])
    root.delete_topic("t")
    root.create_topic("t")
    try:
        write_each(other, "t", [b"after"])
    except kl.TopicNotFound:
        write_each(other, "t", [b"after"])  # one clean failure, then the new topic
    assert values_of(read_all(root, "t")) == [b"after"]


def test_a_consumer_of_another_root_handle_fails_cleanly_after_delete(root):
    root.create_topic("t")
    other = kl.Root(root.path)
    write_each(other, "t", [b"before"])
    assert values_of(read_all(other, "t")) == [b"before"]
    root.delete_topic("t")
    with pytest.raises(kl.TopicNotFound):
        kl.Consumer(other).fetch("t", 0, 0)


def test_unknown_partition_raises_topic_not_found(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    for partition in (-1, 2, 100):
        with pytest.raises(kl.TopicNotFound, match="partitions 0 to 1"):
            root.log("t", partition)


def test_unknown_topic_raises_topic_not_found(root):
    os.makedirs(root.path)
    with pytest.raises(kl.TopicNotFound):
        root.log("nope", 0)
    with pytest.raises(kl.TopicNotFound):
        kl.Producer(root).send("nope", b"x")


def test_topics_are_independent(root):
    root.create_topic("a")
    root.create_topic("b")
    write(root, "a", [b"1", b"2"])
    write(root, "b", [b"3"])
    assert values_of(read_all(root, "a")) == [b"1", b"2"]
    assert values_of(read_all(root, "b")) == [b"3"]


# ----------------------------------------------------------------- config


def test_config_defaults():
    config = kl.TopicConfig()
    assert (config.partitions, config.segment_bytes, config.max_message_bytes) == (1, 1 << 30, 1 << 20)
    assert (config.flush_messages, config.flush_ms) == (0, 1_000)


@pytest.mark.parametrize(
    "settings",
    [
        {"partitions": 0},
        {"partitions": 10_001},
        {"partitions": -1},
        {"max_message_bytes": 63},
        {"max_message_bytes": 1 << 31, "segment_bytes": 1 << 32},
        {"segment_bytes": 100, "max_message_bytes": 200},
        {"flush_ms": -1},
        {"partitions": True},
        {"partitions": 1.5},
    ],
)
def test_bad_configs_raise_invalid_config(settings):
    with pytest.raises(kl.InvalidConfig):
        kl.TopicConfig(**settings)


def test_config_json_round_trips():
    config = kl.TopicConfig(partitions=3, flush_messages=0, retention_bytes=5)
    assert kl.TopicConfig.from_json(config.to_json(), "x") == config


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'{"partitions": 0}', b'{"colour": 1}', b'{"partitions": "1"}'])
def test_an_unreadable_config_file_raises_invalid_config(data):
    with pytest.raises(kl.InvalidConfig, match="topic.json"):
        kl.TopicConfig.from_json(data, "topic.json")


def test_a_damaged_config_file_raises_invalid_config_on_use(root):
    root.create_topic("t")
    (partition_dir(root, "t").parent / CONFIG_FILE).write_text("{not json")
    with pytest.raises(kl.InvalidConfig):
        kl.Root(root.path).config("t")


def test_with_overrides_ignores_none():
    assert kl.TopicConfig.with_overrides(partitions=4, segment_bytes=None) == kl.TopicConfig(partitions=4)
